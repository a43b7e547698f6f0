//! The upstream registry client of the registry agent: the distribution
//! spec's pull API over HTTP(S), with Bearer-token auth when the registry
//! asks for it (the token flow of the Docker registry token spec, which
//! distribution-spec §"Authentication" defers to: a 401 with
//! `WWW-Authenticate: Bearer realm=…,service=…,scope=…` → GET the realm with
//! service and scope → `{"token"|"access_token": …}` → retry with
//! `Authorization: Bearer`).

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use reqwest::header::{HeaderMap, ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};

use super::digest::{Digest, Reference};
use super::source::SourceError;

/// The media types asked for when the client gave no `Accept`: every manifest
/// and index type (distribution-spec "Pulling manifests": the client SHOULD
/// send the types it supports; a registry answers 404/406 to types it was not
/// asked for).
pub const DEFAULT_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// An upstream registry.
#[derive(Debug)]
pub struct Upstream {
    base: String,
    http: reqwest::Client,
    tokens: Mutex<HashMap<String, String>>,
}

impl Upstream {
    /// A client of the registry at `base` (`http://host:port` or `https://…`).
    pub fn new(base: &str) -> Result<Upstream, SourceError> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SourceError::Config(format!(
                "upstream `{base}` must start with http:// or https://"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| SourceError::Config(format!("HTTP client: {e}")))?;
        Ok(Upstream {
            base,
            http,
            tokens: Mutex::new(HashMap::new()),
        })
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Send `method url` with `accept`, following a Bearer challenge once.
    async fn send(
        &self,
        method: Method,
        repo: &str,
        url: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::Response, SourceError> {
        let mut retried = false;
        loop {
            let mut req = self.http.request(method.clone(), url);
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            let token = self.tokens.lock().expect("token lock").get(repo).cloned();
            if let Some(t) = token {
                req = req.header(AUTHORIZATION, format!("Bearer {t}"));
            }
            let resp = req.send().await.map_err(|e| self.unreachable(e))?;
            if resp.status() != StatusCode::UNAUTHORIZED || retried {
                return Ok(resp);
            }
            let Some(challenge) = bearer_challenge(resp.headers()) else {
                return Ok(resp);
            };
            let token = self.token(&challenge, repo).await?;
            self.tokens
                .lock()
                .expect("token lock")
                .insert(repo.to_string(), token);
            retried = true;
        }
    }

    fn unreachable(&self, e: reqwest::Error) -> SourceError {
        SourceError::Unreachable(format!(
            "upstream {}: {e} (is the registry running and --upstream right?)",
            self.base
        ))
    }

    async fn token(&self, c: &Challenge, repo: &str) -> Result<String, SourceError> {
        let scope = c
            .scope
            .clone()
            .unwrap_or_else(|| format!("repository:{repo}:pull"));
        let mut q = vec![("scope", scope)];
        if let Some(s) = &c.service {
            q.push(("service", s.clone()));
        }
        let resp = self
            .http
            .get(&c.realm)
            .query(&q)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if !resp.status().is_success() {
            return Err(SourceError::Upstream(format!(
                "token endpoint {} answered {}",
                c.realm,
                resp.status()
            )));
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| SourceError::Upstream(format!("token endpoint {}: {e}", c.realm)))?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| SourceError::Upstream(format!("token endpoint {}: {e}", c.realm)))?;
        v.get("token")
            .or_else(|| v.get("access_token"))
            .and_then(|t| t.as_str())
            .map(str::to_string)
            .ok_or_else(|| {
                SourceError::Upstream(format!("token endpoint {} gave no token", c.realm))
            })
    }

    /// A manifest or index: body, media type, digest of the body.
    pub async fn manifest(
        &self,
        repo: &str,
        reference: &Reference,
        accept: &str,
    ) -> Result<(Bytes, String, Digest), SourceError> {
        let url = format!("{}/v2/{repo}/manifests/{reference}", self.base);
        // A client that names no manifest type (none, or `*/*` as generic
        // HTTP clients send) gets every type: registries answer only types asked for.
        let accept = if !accept.contains("application/vnd.") {
            DEFAULT_ACCEPT
        } else {
            accept
        };
        let resp = self.send(Method::GET, repo, &url, Some(accept)).await?;
        let resp = check(resp, &url)?;
        let media_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/vnd.oci.image.manifest.v1+json")
            .to_string();
        let body = resp
            .bytes()
            .await
            .map_err(|e| SourceError::Upstream(format!("{url}: {e}")))?;
        let digest = Digest::of(&body);
        if let Reference::Digest(want) = reference {
            if *want != digest {
                return Err(SourceError::DigestMismatch {
                    expected: *want,
                    actual: digest,
                });
            }
        }
        Ok((body, media_type, digest))
    }

    /// Every tag of `repo`, in lexical order (distribution-spec "Listing
    /// Tags", end-8a, following `Link` pages; at most
    /// [`super::manifests::MAX_TAGS`] tags in at most 1 000 pages).
    pub async fn tags(&self, repo: &str) -> Result<Vec<String>, SourceError> {
        let mut url = format!("{}/v2/{repo}/tags/list", self.base);
        let mut tags = Vec::new();
        for _ in 0..1000 {
            let resp = check(self.send(Method::GET, repo, &url, None).await?, &url)?;
            let next = next_link(resp.headers(), &self.base);
            let body = resp
                .bytes()
                .await
                .map_err(|e| SourceError::Upstream(format!("{url}: {e}")))?;
            let v: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| SourceError::Upstream(format!("{url}: not a tag list: {e}")))?;
            // A repository with no tags may say `"tags": null`.
            tags.extend(
                v["tags"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str().map(str::to_string)),
            );
            if tags.len() > super::manifests::MAX_TAGS {
                return Err(SourceError::Upstream(format!(
                    "{repo}: more than {} tags",
                    super::manifests::MAX_TAGS
                )));
            }
            match next {
                Some(n) => url = n,
                None => {
                    tags.sort();
                    tags.dedup();
                    return Ok(tags);
                }
            }
        }
        Err(SourceError::Upstream(format!(
            "{repo}: tag list longer than 1000 pages"
        )))
    }

    /// The size of a blob (HEAD).
    pub async fn blob_size(&self, repo: &str, digest: &Digest) -> Result<u64, SourceError> {
        let url = format!("{}/v2/{repo}/blobs/{digest}", self.base);
        let resp = check(self.send(Method::HEAD, repo, &url, None).await?, &url)?;
        // The header itself: reqwest's content_length() is the body's size
        // hint, which is 0 for a HEAD.
        resp.headers()
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .ok_or_else(|| SourceError::Upstream(format!("{url}: no Content-Length")))
    }

    /// The whole blob as a response to stream from.
    pub async fn blob(
        &self,
        repo: &str,
        digest: &Digest,
    ) -> Result<reqwest::Response, SourceError> {
        let url = format!("{}/v2/{repo}/blobs/{digest}", self.base);
        check(self.send(Method::GET, repo, &url, None).await?, &url)
    }
}

fn check(resp: reqwest::Response, url: &str) -> Result<reqwest::Response, SourceError> {
    match resp.status() {
        s if s.is_success() => Ok(resp),
        StatusCode::NOT_FOUND => Err(SourceError::NotFound(url.to_string())),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(SourceError::Upstream(format!(
            "{url}: {} (the upstream wants credentials this agent does not have)",
            resp.status()
        ))),
        // The registry is there but cannot serve now (RFC 9110 §15.6):
        // as good as unreachable, so cached manifests are served stale.
        s if s.is_server_error() => Err(SourceError::Unreachable(format!(
            "{url}: HTTP {s} (the upstream registry is failing)"
        ))),
        s => Err(SourceError::Upstream(format!("{url}: HTTP {s}"))),
    }
}

/// The next page of a paginated list: the `Link: <url>; rel="next"` header
/// (distribution-spec "Listing Tags", RFC 8288), resolved against `base`.
fn next_link(h: &HeaderMap, base: &str) -> Option<String> {
    let v = h.get(reqwest::header::LINK)?.to_str().ok()?;
    v.split(',').find_map(|link| {
        let (target, params) = link.split_once(';')?;
        let rel_next = params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"" || p.trim() == "rel=next");
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        rel_next.then(|| {
            if target.starts_with('/') {
                format!("{base}{target}")
            } else {
                target.to_string()
            }
        })
    })
}

/// A parsed `WWW-Authenticate: Bearer …` challenge.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Challenge {
    realm: String,
    service: Option<String>,
    scope: Option<String>,
}

fn bearer_challenge(h: &HeaderMap) -> Option<Challenge> {
    parse_challenge(h.get(WWW_AUTHENTICATE)?.to_str().ok()?)
}

/// Parse `Bearer realm="…",service="…",scope="…"` (RFC 6750 §3 syntax).
pub(crate) fn parse_challenge(v: &str) -> Option<Challenge> {
    let rest = v.trim().strip_prefix("Bearer ")?;
    let mut params = HashMap::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let (k, after) = s.split_once('=')?;
        let after = after.trim_start();
        let (val, tail) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], &q[end + 1..])
        } else {
            match after.find(',') {
                Some(i) => (&after[..i], &after[i..]),
                None => (after, ""),
            }
        };
        params.insert(k.trim().to_ascii_lowercase(), val.to_string());
        s = tail.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge {
        realm: params.remove("realm")?,
        service: params.remove("service"),
        scope: params.remove("scope"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#,
        )
        .unwrap();
        assert_eq!(c.realm, "https://auth.example/token");
        assert_eq!(c.service.as_deref(), Some("registry.example"));
        assert_eq!(c.scope.as_deref(), Some("repository:a/b:pull"));
        assert!(parse_challenge("Basic realm=\"x\"").is_none());
        assert!(parse_challenge("Bearer service=\"x\"").is_none());
        assert!(parse_challenge("Bearer realm=\"unterminated").is_none());
    }

    #[test]
    fn next_links() {
        let mut h = HeaderMap::new();
        h.insert(
            reqwest::header::LINK,
            r#"</v2/a/tags/list?n=2&last=b>; rel="next""#.parse().unwrap(),
        );
        assert_eq!(
            next_link(&h, "http://r:5000").as_deref(),
            Some("http://r:5000/v2/a/tags/list?n=2&last=b")
        );
        h.insert(
            reqwest::header::LINK,
            r#"<https://x/y>; rel="prev""#.parse().unwrap(),
        );
        assert_eq!(next_link(&h, "http://r"), None);
    }
}
