//! Where a registry agent gets images: an upstream registry over HTTP
//! ([`super::upstream::Upstream`]) or an OCI image-layout directory
//! (image-spec "Image Layout": `oci-layout`, `index.json`, `blobs/sha256/…`).

use std::path::PathBuf;

use bytes::Bytes;
use tokio::io::AsyncReadExt;

use super::digest::{Digest, Reference};
use super::upstream::Upstream;

/// Why the source could not give an object.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The object does not exist there.
    #[error("not found: {0}")]
    NotFound(String),
    /// The upstream could not be reached.
    #[error("{0}")]
    Unreachable(String),
    /// The upstream answered with an error.
    #[error("upstream error: {0}")]
    Upstream(String),
    /// The bytes do not hash to the digest asked for.
    #[error("upstream content of {expected} hashes to {actual}: the upstream copy is corrupt")]
    DigestMismatch {
        /// Asked for.
        expected: Digest,
        /// Got.
        actual: Digest,
    },
    /// The agent's configuration is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// A local file operation failed (layout directory, spool).
    #[error("local I/O: {0}")]
    Io(String),
}

/// An image source.
#[derive(Debug)]
pub enum Source {
    /// A registry over HTTP, pulled through.
    Upstream(Upstream),
    /// An OCI image-layout directory.
    Layout(PathBuf),
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
    /// A manifest or index: body, media type, digest.
    pub async fn manifest(
        &self,
        repo: &str,
        reference: &Reference,
        accept: &str,
    ) -> Result<(Bytes, String, Digest), SourceError> {
        match self {
            Source::Upstream(u) => u.manifest(repo, reference, accept).await,
            Source::Layout(dir) => layout_manifest(dir, reference).await,
        }
    }

    /// A blob's size.
    pub async fn blob_size(&self, repo: &str, digest: &Digest) -> Result<u64, SourceError> {
        match self {
            Source::Upstream(u) => u.blob_size(repo, digest).await,
            Source::Layout(dir) => tokio::fs::metadata(layout_blob(dir, digest))
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
            Source::Layout(dir) => {
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

/// image-spec "Image Layout": a tag is the `org.opencontainers.image.ref.name`
/// annotation of a descriptor in `index.json`.
async fn layout_manifest(
    dir: &std::path::Path,
    reference: &Reference,
) -> Result<(Bytes, String, Digest), SourceError> {
    let (digest, media_type) = match reference {
        Reference::Digest(d) => (*d, None),
        Reference::Tag(tag) => {
            let index = tokio::fs::read(dir.join("index.json"))
                .await
                .map_err(|e| SourceError::Config(format!("{}/index.json: {e}", dir.display())))?;
            let v: serde_json::Value = serde_json::from_slice(&index)
                .map_err(|e| SourceError::Config(format!("{}/index.json: {e}", dir.display())))?;
            let found = v["manifests"].as_array().and_then(|ms| {
                ms.iter().find(|m| {
                    m["annotations"]["org.opencontainers.image.ref.name"].as_str() == Some(tag)
                })
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
