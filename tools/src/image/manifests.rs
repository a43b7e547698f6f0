//! The registry agent's manifest cache, so a registry outage does not stop
//! pulls of images the agents already hold.
//!
//! - **By digest** a manifest or index is immutable (distribution-spec
//!   "Pulling manifests": the digest is of the body) and is served from here
//!   like a cached blob — but only under a repository the upstream served it
//!   for, and only after its bytes hash to its digest again (a corrupt copy
//!   is deleted, counted in `qr_registry_cache_corrupt_total` and fetched
//!   afresh).
//! - **By tag** the answer is cached for a TTL: within it the upstream is not
//!   asked; past it, it is; and while the upstream cannot be reached (no
//!   connection, or a 5xx), the last answer is served *stale* for up to
//!   `max_stale` more, flagged on the wire ([`super::wire::Response::Ok`]'s
//!   `stale`), in the node agent's `X-Qr-Stale` header and in
//!   `qr_registry_manifests_stale_total`. A tag the upstream says is gone is
//!   forgotten.
//! - **Tag lists** (`tags/list`) follow the tag rule.
//!
//! Bodies live in `DIR/sha256/<hex>`, the index in `DIR/index.json` (written
//! whole to a temp file and renamed: a crash leaves the old or the new one);
//! both survive restarts. Bounded: at most `max_entries` manifests (least
//! recently used go first, with the tags that name them), none above
//! [`MAX_MANIFEST_BYTES`], tag lists of at most [`MAX_TAGS`] tags. Time is
//! passed in (`now`, unix seconds), so the rules are tested without a clock.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::digest::{Digest, Reference};
use super::metrics::RegistryMetrics;

/// Largest manifest kept (distribution-spec "Pushing manifests": registries
/// SHOULD accept manifests of at least 4 MiB); a larger one is served, not kept.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Most tags a cached tag list holds (a longer list is served, not kept).
pub const MAX_TAGS: usize = 100_000;

/// How long cached answers count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestPolicy {
    /// How long an answer by tag (or a tag list) is served without asking
    /// the upstream.
    pub ttl: Duration,
    /// How much longer than `ttl` it is served, flagged stale, while the
    /// upstream cannot be reached.
    pub max_stale: Duration,
    /// Most manifests kept.
    pub max_entries: usize,
}

impl Default for ManifestPolicy {
    fn default() -> Self {
        ManifestPolicy {
            ttl: Duration::from_secs(30),
            max_stale: Duration::from_secs(7 * 24 * 3600),
            max_entries: 10_000,
        }
    }
}

/// A manifest or index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The body, byte for byte as the upstream sent it.
    pub body: Bytes,
    /// Its media type (the upstream's `Content-Type`).
    pub media_type: String,
    /// The digest of the body.
    pub digest: Digest,
}

/// Whether a manifest of `media_type` answers a client that sent `accept`
/// (distribution-spec "Pulling manifests": the client names the types it
/// takes; one that names no manifest type takes any).
pub fn accepts(accept: &str, media_type: &str) -> bool {
    !accept.contains("application/vnd.")
        || accept
            .split(',')
            .any(|a| a.split(';').next().unwrap_or("").trim() == media_type)
}

/// Every descriptor in a manifest or index: its digest, and whether it names
/// a manifest or index (image-spec "Image Index" `manifests`, "Image
/// Manifest" `config`, `layers`, `subject`). Not JSON, or no descriptors: none.
pub fn descriptors(doc: &[u8]) -> Vec<(Digest, bool)> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(doc) else {
        return Vec::new();
    };
    let one = |desc: &serde_json::Value| -> Option<(Digest, bool)> {
        let d = desc["digest"].as_str()?.parse().ok()?;
        let manifest = desc["mediaType"]
            .as_str()
            .is_some_and(|m| m.contains("manifest") || m.contains("index"));
        Some((d, manifest))
    };
    let mut out: Vec<(Digest, bool)> = ["manifests", "layers"]
        .iter()
        .flat_map(|list| v[*list].as_array().into_iter().flatten())
        .filter_map(one)
        .collect();
    out.extend(["config", "subject"].iter().filter_map(|k| one(&v[*k])));
    out
}

/// A cached answer by tag, or a tag list: when it was fetched.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Tagged<T> {
    value: T,
    fetched: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Repo {
    /// Manifests (digests) the upstream served under this repository.
    digests: BTreeSet<String>,
    /// tag → the digest the upstream answered it with.
    tags: BTreeMap<String, Tagged<String>>,
    /// The repository's tags.
    tag_list: Option<Tagged<Vec<String>>>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Meta {
    media_type: String,
    size: u64,
    /// Last served or stored (unix seconds): eviction order.
    used: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    /// digest → what is known of its body.
    manifests: BTreeMap<String, Meta>,
    repos: BTreeMap<String, Repo>,
}

/// Why a cached answer is being looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// To answer without asking the upstream: within the TTL only.
    Fresh,
    /// The upstream cannot be reached: up to `ttl + max_stale`.
    Stale,
}

/// The manifest cache of one registry agent.
#[derive(Debug)]
pub struct ManifestCache {
    dir: PathBuf,
    policy: ManifestPolicy,
    index: Mutex<Index>,
    metrics: Arc<RegistryMetrics>,
}

impl ManifestCache {
    /// Open (creating) the cache in `dir`; bodies the index does not name
    /// (a crash between writing one and the index) are deleted. An index that
    /// cannot be read is logged and started afresh: losing it only costs
    /// fetches.
    pub fn open(
        dir: &Path,
        policy: ManifestPolicy,
        metrics: Arc<RegistryMetrics>,
    ) -> std::io::Result<ManifestCache> {
        let bodies = dir.join("sha256");
        fs::create_dir_all(&bodies)?;
        let index: Index = match fs::read(dir.join("index.json")) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(
                    "{}/index.json: {e}; starting the manifest cache afresh",
                    dir.display()
                );
                Index::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Index::default(),
            Err(e) => return Err(e),
        };
        for e in fs::read_dir(&bodies)? {
            let e = e?;
            let known = e
                .file_name()
                .to_str()
                .is_some_and(|h| index.manifests.contains_key(&format!("sha256:{h}")));
            if !known {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(ManifestCache {
            dir: dir.to_path_buf(),
            policy,
            index: Mutex::new(index),
            metrics,
        })
    }

    /// The policy.
    pub fn policy(&self) -> ManifestPolicy {
        self.policy
    }

    /// Manifests held.
    pub fn len(&self) -> usize {
        self.lock().manifests.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn body_path(&self, d: &Digest) -> PathBuf {
        self.dir.join("sha256").join(d.hex())
    }

    /// Whether an answer fetched at `fetched` may serve `want` at `now`.
    fn usable(&self, fetched: u64, now: u64, want: Want) -> bool {
        let age = Duration::from_secs(now.saturating_sub(fetched));
        match want {
            Want::Fresh => age < self.policy.ttl,
            Want::Stale => age < self.policy.ttl + self.policy.max_stale,
        }
    }

    /// A cached answer to `repo`/`reference` for a client accepting
    /// `accept`, if one may serve `want` at `now`.
    pub fn get(
        &self,
        repo: &str,
        reference: &Reference,
        accept: &str,
        want: Want,
        now: u64,
    ) -> Option<Manifest> {
        let digest = {
            let ix = self.lock();
            let r = ix.repos.get(repo)?;
            match reference {
                Reference::Digest(d) => {
                    let d = d.to_string();
                    r.digests.contains(&d).then_some(d)?
                }
                Reference::Tag(t) => {
                    let t = r.tags.get(t)?;
                    self.usable(t.fetched, now, want).then(|| t.value.clone())?
                }
            }
        };
        let m = self.read(&digest, now)?;
        accepts(accept, &m.media_type).then_some(m)
    }

    /// The body of `digest`, checked against it; a copy that is missing or
    /// does not match is forgotten (and, if it was corrupt, counted).
    fn read(&self, digest: &str, now: u64) -> Option<Manifest> {
        let d: Digest = digest.parse().ok()?;
        let media_type = self.lock().manifests.get(digest)?.media_type.clone();
        let path = self.body_path(&d);
        let body = match fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(
                    "cached manifest {}: {e}; fetching it afresh",
                    path.display()
                );
                self.forget(digest);
                return None;
            }
        };
        if Digest::of(&body) != d {
            self.metrics.cache_corrupt.inc();
            tracing::warn!(
                "cached manifest {} does not hash to {d}: deleted, fetching it afresh",
                path.display()
            );
            self.forget(digest);
            return None;
        }
        if let Some(m) = self.lock().manifests.get_mut(digest) {
            m.used = now;
        }
        Some(Manifest {
            body: Bytes::from(body),
            media_type,
            digest: d,
        })
    }

    /// Keep what the upstream answered to `repo`/`reference` at `now`.
    pub fn store(&self, repo: &str, reference: &Reference, m: &Manifest, now: u64) {
        if m.body.len() > MAX_MANIFEST_BYTES {
            return;
        }
        let digest = m.digest.to_string();
        let have = self.lock().manifests.contains_key(&digest);
        if !have {
            if let Err(e) = write_atomic(&self.body_path(&m.digest), &m.body) {
                tracing::warn!("caching manifest {digest}: {e}");
                return;
            }
        }
        let mut ix = self.lock();
        ix.manifests.insert(
            digest.clone(),
            Meta {
                media_type: m.media_type.clone(),
                size: m.body.len() as u64,
                used: now,
            },
        );
        let r = ix.repos.entry(repo.to_string()).or_default();
        r.digests.insert(digest.clone());
        if let Reference::Tag(t) = reference {
            r.tags.insert(
                t.clone(),
                Tagged {
                    value: digest,
                    fetched: now,
                },
            );
        }
        self.evict(&mut ix);
        self.persist(&ix);
    }

    /// The upstream says `repo:tag` does not exist (any more).
    pub fn forget_tag(&self, repo: &str, tag: &str) {
        let mut ix = self.lock();
        let removed = ix
            .repos
            .get_mut(repo)
            .is_some_and(|r| r.tags.remove(tag).is_some());
        if removed {
            self.persist(&ix);
        }
    }

    /// The cached tag list of `repo`, if one may serve `want` at `now`.
    pub fn tags(&self, repo: &str, want: Want, now: u64) -> Option<Vec<String>> {
        let ix = self.lock();
        let t = ix.repos.get(repo)?.tag_list.as_ref()?;
        self.usable(t.fetched, now, want).then(|| t.value.clone())
    }

    /// Keep `repo`'s tag list as the upstream gave it at `now` (only for a
    /// repository that has a manifest cached: the list is there to pull by).
    pub fn store_tags(&self, repo: &str, tags: &[String], now: u64) {
        if tags.len() > MAX_TAGS {
            return;
        }
        let mut ix = self.lock();
        if let Some(r) = ix.repos.get_mut(repo) {
            r.tag_list = Some(Tagged {
                value: tags.to_vec(),
                fetched: now,
            });
            self.persist(&ix);
        }
    }

    fn forget(&self, digest: &str) {
        let mut ix = self.lock();
        remove(&mut ix, digest);
        self.persist(&ix);
        if let Ok(d) = digest.parse::<Digest>() {
            let _ = fs::remove_file(self.body_path(&d));
        }
    }

    /// Drop least recently used manifests down to the bound.
    fn evict(&self, ix: &mut Index) {
        while ix.manifests.len() > self.policy.max_entries {
            let Some(oldest) = ix
                .manifests
                .iter()
                .min_by_key(|(_, m)| m.used)
                .map(|(d, _)| d.clone())
            else {
                return;
            };
            remove(ix, &oldest);
            if let Ok(d) = oldest.parse::<Digest>() {
                let _ = fs::remove_file(self.body_path(&d));
            }
        }
    }

    fn persist(&self, ix: &Index) {
        let write = serde_json::to_vec(ix)
            .map_err(std::io::Error::other)
            .and_then(|b| write_atomic(&self.dir.join("index.json"), &b));
        if let Err(e) = write {
            tracing::warn!(
                "{}/index.json: {e} (the manifest cache will not survive a restart)",
                self.dir.display()
            );
        }
    }
}

/// Forget `digest`, and every tag naming it; a repository left with no
/// manifest goes too.
fn remove(ix: &mut Index, digest: &str) {
    ix.manifests.remove(digest);
    ix.repos.retain(|_, r| {
        r.digests.remove(digest);
        r.tags.retain(|_, t| t.value != digest);
        !r.digests.is_empty()
    });
}

/// Write `path` whole or not at all: a temp file beside it, then a rename.
fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, data)?;
    fs::rename(&tmp, path)
}

/// Seconds since the epoch, the cache's clock.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OCI: &str = "application/vnd.oci.image.manifest.v1+json";

    fn manifest(n: u8) -> Manifest {
        let body = Bytes::from(format!(
            r#"{{"mediaType":"{OCI}","config":{{"digest":"{}"}},"n":{n}}}"#,
            Digest::of(&[n])
        ));
        Manifest {
            digest: Digest::of(&body),
            body,
            media_type: OCI.into(),
        }
    }

    fn open(dir: &Path, max_entries: usize) -> ManifestCache {
        let policy = ManifestPolicy {
            ttl: Duration::from_secs(30),
            max_stale: Duration::from_secs(100),
            max_entries,
        };
        ManifestCache::open(dir, policy, Arc::default()).unwrap()
    }

    fn tag(t: &str) -> Reference {
        Reference::Tag(t.into())
    }

    #[test]
    fn tags_fresh_then_stale_then_gone() {
        let dir = tempfile::tempdir().unwrap();
        let c = open(dir.path(), 10);
        let m = manifest(1);
        c.store("a/b", &tag("v1"), &m, 1000);
        let get = |want, now| c.get("a/b", &tag("v1"), "", want, now);
        assert_eq!(get(Want::Fresh, 1029), Some(m.clone()));
        assert_eq!(get(Want::Fresh, 1030), None, "past the TTL: ask upstream");
        assert_eq!(get(Want::Stale, 1129), Some(m.clone()));
        assert_eq!(get(Want::Stale, 1130), None, "past max_stale");
        // Another repository never sees it, by tag or by digest.
        assert_eq!(c.get("a/c", &tag("v1"), "", Want::Stale, 1000), None);
        let by_digest = Reference::Digest(m.digest);
        assert_eq!(c.get("a/c", &by_digest, "", Want::Fresh, 1000), None);
        // By digest it never ages.
        assert_eq!(c.get("a/b", &by_digest, "", Want::Fresh, 9999), Some(m));
        c.forget_tag("a/b", "v1");
        assert_eq!(get(Want::Stale, 1001), None);
    }

    #[test]
    fn accept_is_honoured() {
        let dir = tempfile::tempdir().unwrap();
        let c = open(dir.path(), 10);
        c.store("r", &tag("t"), &manifest(1), 0);
        let docker = "application/vnd.docker.distribution.manifest.v2+json";
        assert!(c.get("r", &tag("t"), docker, Want::Fresh, 0).is_none());
        assert!(c
            .get("r", &tag("t"), &format!("{docker}, {OCI}"), Want::Fresh, 0)
            .is_some());
        assert!(c.get("r", &tag("t"), "*/*", Want::Fresh, 0).is_some());
    }

    #[test]
    fn survives_a_restart_and_refuses_a_corrupt_copy() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest(2);
        {
            let c = open(dir.path(), 10);
            c.store("r", &tag("t"), &m, 50);
            c.store_tags("r", &["t".into(), "u".into()], 50);
        }
        let c = open(dir.path(), 10);
        assert_eq!(c.get("r", &tag("t"), "", Want::Fresh, 60), Some(m.clone()));
        assert_eq!(
            c.tags("r", Want::Fresh, 60),
            Some(vec!["t".into(), "u".into()])
        );
        let path = dir.path().join("sha256").join(m.digest.hex());
        let mut b = fs::read(&path).unwrap();
        b[3] ^= 1;
        fs::write(&path, b).unwrap();
        assert_eq!(c.get("r", &tag("t"), "", Want::Fresh, 60), None);
        assert_eq!(c.metrics.cache_corrupt.get(), 1);
        assert!(!path.exists(), "the corrupt copy is deleted");
        assert!(c.is_empty());
    }

    #[test]
    fn bounded_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let c = open(dir.path(), 2);
        c.store("r", &tag("one"), &manifest(1), 1);
        c.store("r", &tag("two"), &manifest(2), 2);
        // Used again: now the newest.
        assert!(c.get("r", &tag("one"), "", Want::Fresh, 3).is_some());
        c.store("r", &tag("three"), &manifest(3), 4);
        assert_eq!(c.len(), 2);
        assert!(c.get("r", &tag("two"), "", Want::Stale, 5).is_none());
        assert!(c.get("r", &tag("one"), "", Want::Stale, 5).is_some());
        let files = fs::read_dir(dir.path().join("sha256")).unwrap().count();
        assert_eq!(files, 2, "an evicted body is deleted");
    }

    #[test]
    fn descriptors_of_manifests_and_indexes() {
        let (a, b, c) = (Digest::of(b"a"), Digest::of(b"b"), Digest::of(b"c"));
        let index = format!(
            r#"{{"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{a}"}}]}}"#
        );
        assert_eq!(descriptors(index.as_bytes()), vec![(a, true)]);
        let m = format!(
            r#"{{"config":{{"digest":"{b}"}},"layers":[{{"digest":"{c}"}},{{"digest":"bad"}}]}}"#
        );
        assert_eq!(descriptors(m.as_bytes()), vec![(c, false), (b, false)]);
        assert!(descriptors(b"not json").is_empty());
    }
}
