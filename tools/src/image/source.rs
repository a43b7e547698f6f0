//! Where a registry agent gets images: upstream registries over HTTP(S)
//! ([`Upstreams`]: a default one and any number named by the registry host a
//! client's `ns=` names) or an OCI image-layout directory (image-spec "Image
//! Layout": `oci-layout`, `index.json`, `blobs/sha256/…`).

use std::path::PathBuf;

use bytes::Bytes;
use tokio::io::AsyncReadExt;

use super::digest::{scoped, split_scope, Digest, Reference};
use super::manifests::descriptors;
use super::source_error::SourceError;
use super::upstream::Upstream;

/// The upstream registries of one registry agent: requests for a scoped
/// repository (`NS//NAME`, [`super::digest::scoped`]) go to the registry named
/// NS if there is one, any other request to the default.
#[derive(Debug, Default)]
pub struct Upstreams {
    default: Option<Upstream>,
    named: std::collections::BTreeMap<String, Upstream>,
}

impl From<Upstream> for Upstreams {
    fn from(u: Upstream) -> Upstreams {
        Upstreams {
            default: Some(u),
            named: Default::default(),
        }
    }
}

impl Upstreams {
    /// Serve requests naming registry `ns` from `upstream` (`None`: every
    /// request naming no registry this agent knows).
    pub fn add(&mut self, ns: Option<String>, upstream: Upstream) {
        match ns {
            Some(ns) => {
                self.named.insert(ns, upstream);
            }
            None => self.default = Some(upstream),
        }
    }

    /// The repository as this agent keys it: scoped by the registry that
    /// serves it (unscoped for the default), so every table keeps two
    /// registries' repositories apart however clients name them.
    pub fn canonical(&self, repo: &str) -> Result<String, SourceError> {
        let (ns, name) = split_scope(repo);
        if let Some(ns) = ns.filter(|ns| self.named.contains_key(*ns)) {
            return Ok(scoped(Some(ns), name));
        }
        if self.default.is_some() {
            return Ok(name.to_string());
        }
        Err(SourceError::NotFound(format!(
            "{name}: no upstream for registry {} (give --upstream {}=URL)",
            ns.unwrap_or("(none named)"),
            ns.unwrap_or("HOST")
        )))
    }

    /// The upstream of a canonical repository, and the name to ask it for.
    fn pick<'a>(&self, repo: &'a str) -> Result<(&Upstream, &'a str), SourceError> {
        let (ns, name) = split_scope(repo);
        let u = match ns {
            Some(ns) => self.named.get(ns),
            None => self.default.as_ref(),
        };
        u.map(|u| (u, name))
            .ok_or_else(|| SourceError::NotFound(format!("no upstream for {repo}")))
    }

    /// Every upstream's base URL, for logs: `NS=URL` or `URL`.
    pub fn describe(&self) -> String {
        let named = self
            .named
            .iter()
            .map(|(ns, u)| format!("{ns}={}", u.base()));
        self.default
            .iter()
            .map(|u| u.base().to_string())
            .chain(named)
            .collect::<Vec<_>>()
            .join(", ")
    }

    async fn manifest(
        &self,
        repo: &str,
        reference: &Reference,
        accept: &str,
    ) -> Result<(Bytes, String, Digest), SourceError> {
        let (u, name) = self.pick(repo)?;
        u.manifest(name, reference, accept).await
    }

    async fn tags(&self, repo: &str) -> Result<Vec<String>, SourceError> {
        let (u, name) = self.pick(repo)?;
        u.tags(name).await
    }

    async fn blob_size(&self, repo: &str, d: &Digest) -> Result<u64, SourceError> {
        let (u, name) = self.pick(repo)?;
        u.blob_size(name, d).await
    }

    async fn blob(&self, repo: &str, d: &Digest) -> Result<reqwest::Response, SourceError> {
        let (u, name) = self.pick(repo)?;
        u.blob(name, d).await
    }
}

/// An image source.
#[derive(Debug)]
pub enum Source {
    /// Registries over HTTP(S), pulled through.
    Upstream(Upstreams),
    /// An OCI image-layout directory, served as one repository.
    Layout {
        /// The directory (`oci-layout`, `index.json`, `blobs/`).
        dir: PathBuf,
        /// The repository name it is served under; any other name is unknown.
        repository: String,
    },
}

/// A blob being read from its source, front to back.
#[derive(Debug)]
pub enum BlobReader {
    /// An HTTP response body.
    Http(reqwest::Response),
    /// A layout file.
    File(tokio::fs::File),
}

impl BlobReader {
    /// The next piece, `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Bytes>, SourceError> {
        match self {
            BlobReader::Http(r) => r
                .chunk()
                .await
                .map_err(|e| SourceError::Upstream(format!("reading a blob: {e}"))),
            BlobReader::File(f) => {
                let mut buf = vec![0u8; 1 << 20];
                let n = f
                    .read(&mut buf)
                    .await
                    .map_err(|e| SourceError::Io(e.to_string()))?;
                buf.truncate(n);
                Ok((n > 0).then(|| Bytes::from(buf)))
            }
        }
    }
}

impl Source {
    /// The repository as this source keys it ([`Upstreams::canonical`]; a
    /// layout ignores the registry a client names).
    pub fn canonical(&self, repo: &str) -> Result<String, SourceError> {
        match self {
            Source::Upstream(u) => u.canonical(repo),
            Source::Layout { .. } => Ok(split_scope(repo).1.to_string()),
        }
    }

    /// A manifest or index: body, media type, digest.
    pub async fn manifest(
        &self,
        repo: &str,
        reference: &Reference,
        accept: &str,
    ) -> Result<(Bytes, String, Digest), SourceError> {
        match self {
            Source::Upstream(u) => u.manifest(repo, reference, accept).await,
            Source::Layout { dir, repository } => {
                if repo != repository {
                    return Err(unknown_repository(repo));
                }
                if let Reference::Digest(d) = reference {
                    // A manifest by digest must be one this repository's index reaches.
                    if !layout_references(dir).await?.contains(d) {
                        return Err(SourceError::NotFound(format!("manifest {d} in {repo}")));
                    }
                }
                layout_manifest(dir, reference).await
            }
        }
    }

    /// Every tag of `repo`, in lexical order: the upstream's list, or the
    /// layout's `org.opencontainers.image.ref.name` annotations.
    pub async fn tags(&self, repo: &str) -> Result<Vec<String>, SourceError> {
        match self {
            Source::Upstream(u) => u.tags(repo).await,
            Source::Layout { dir, repository } => {
                if repo != repository {
                    return Err(unknown_repository(repo));
                }
                let v = layout_index(dir).await?;
                let mut tags: Vec<String> = v["manifests"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| m["annotations"][REF_NAME].as_str().map(str::to_string))
                    .collect();
                tags.sort();
                tags.dedup();
                Ok(tags)
            }
        }
    }

    /// Confirm that repository `repo` references blob `d` (OCI distribution
    /// spec: a blob is fetched through a repository that links it): asked of
    /// the upstream (a HEAD under that name), or found by walking the
    /// layout's manifests from its index. [`SourceError::NotFound`] if not.
    pub async fn confirm_reference(&self, repo: &str, d: &Digest) -> Result<(), SourceError> {
        match self {
            Source::Upstream(u) => u.blob_size(repo, d).await.map(drop),
            Source::Layout { dir, repository } => {
                if repo != repository {
                    return Err(unknown_repository(repo));
                }
                if layout_references(dir).await?.contains(d) {
                    Ok(())
                } else {
                    Err(SourceError::NotFound(format!(
                        "blob {d} is not referenced by repository {repo}"
                    )))
                }
            }
        }
    }

    /// A blob's size.
    pub async fn blob_size(&self, repo: &str, digest: &Digest) -> Result<u64, SourceError> {
        match self {
            Source::Upstream(u) => u.blob_size(repo, digest).await,
            Source::Layout { dir, .. } => tokio::fs::metadata(layout_blob(dir, digest))
                .await
                .map(|m| m.len())
                .map_err(|_| SourceError::NotFound(digest.to_string())),
        }
    }

    /// A blob to read and its size.
    pub async fn blob(
        &self,
        repo: &str,
        digest: &Digest,
    ) -> Result<(BlobReader, u64), SourceError> {
        match self {
            Source::Upstream(u) => {
                let r = u.blob(repo, digest).await?;
                let size = r.content_length().ok_or_else(|| {
                    SourceError::Upstream(format!("blob {digest}: no Content-Length"))
                })?;
                Ok((BlobReader::Http(r), size))
            }
            Source::Layout { dir, .. } => {
                let f = tokio::fs::File::open(layout_blob(dir, digest))
                    .await
                    .map_err(|_| SourceError::NotFound(digest.to_string()))?;
                let size = f
                    .metadata()
                    .await
                    .map_err(|e| SourceError::Io(e.to_string()))?
                    .len();
                Ok((BlobReader::File(f), size))
            }
        }
    }
}

fn layout_blob(dir: &std::path::Path, d: &Digest) -> PathBuf {
    dir.join("blobs/sha256").join(d.hex())
}

fn unknown_repository(repo: &str) -> SourceError {
    SourceError::NotFound(format!("repository {repo} is not served here"))
}

/// Most descriptors a layout's manifests may hold before the walk gives up
/// (a malformed or hostile layout must not run the agent out of memory).
const MAX_LAYOUT_DESCRIPTORS: usize = 1 << 16;

/// Every digest the layout's `index.json` reaches: its manifests and indexes,
/// and their configs, layers and sub-manifests (image-spec "Image Index",
/// "Image Manifest"). Blobs no manifest references are not part of the image.
async fn layout_references(
    dir: &std::path::Path,
) -> Result<std::collections::HashSet<Digest>, SourceError> {
    let index = layout_index_bytes(dir).await?;
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![index];
    while let Some(doc) = todo.pop() {
        for (d, is_manifest) in descriptors(&doc) {
            if seen.len() >= MAX_LAYOUT_DESCRIPTORS {
                return Err(SourceError::Config(format!(
                    "{}: more than {MAX_LAYOUT_DESCRIPTORS} descriptors",
                    dir.display()
                )));
            }
            if !seen.insert(d) {
                continue;
            }
            if is_manifest {
                if let Ok(body) = tokio::fs::read(layout_blob(dir, &d)).await {
                    if Digest::of(&body) == d {
                        todo.push(body);
                    }
                }
            }
        }
    }
    Ok(seen)
}

/// image-spec "Image Layout": the annotation naming a tag.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

fn layout_index_error(dir: &std::path::Path, e: &dyn std::fmt::Display) -> SourceError {
    SourceError::Config(format!("{}/index.json: {e}", dir.display()))
}

/// The layout's `index.json`.
async fn layout_index_bytes(dir: &std::path::Path) -> Result<Vec<u8>, SourceError> {
    tokio::fs::read(dir.join("index.json"))
        .await
        .map_err(|e| layout_index_error(dir, &e))
}

/// The layout's `index.json`, parsed.
async fn layout_index(dir: &std::path::Path) -> Result<serde_json::Value, SourceError> {
    serde_json::from_slice(&layout_index_bytes(dir).await?).map_err(|e| layout_index_error(dir, &e))
}

/// image-spec "Image Layout": a tag is the `org.opencontainers.image.ref.name`
/// annotation of a descriptor in `index.json`.
async fn layout_manifest(
    dir: &std::path::Path,
    reference: &Reference,
) -> Result<(Bytes, String, Digest), SourceError> {
    let (digest, media_type) = match reference {
        Reference::Digest(d) => (*d, None),
        Reference::Tag(tag) => {
            let v = layout_index(dir).await?;
            let found = v["manifests"].as_array().and_then(|ms| {
                ms.iter()
                    .find(|m| m["annotations"][REF_NAME].as_str() == Some(tag))
            });
            let m = found.ok_or_else(|| SourceError::NotFound(format!("tag {tag}")))?;
            let d: Digest = m["digest"]
                .as_str()
                .unwrap_or_default()
                .parse()
                .map_err(|e| SourceError::Config(format!("index.json: {e}")))?;
            (d, m["mediaType"].as_str().map(str::to_string))
        }
    };
    let body = tokio::fs::read(layout_blob(dir, &digest))
        .await
        .map_err(|_| SourceError::NotFound(digest.to_string()))?;
    let actual = Digest::of(&body);
    if actual != digest {
        return Err(SourceError::DigestMismatch {
            expected: digest,
            actual,
        });
    }
    let media_type = media_type
        .or_else(|| {
            serde_json::from_slice::<serde_json::Value>(&body)
                .ok()?
                .get("mediaType")?
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".into());
    Ok((Bytes::from(body), media_type, digest))
}
