//! The upstream registry client of the registry agent: the distribution
//! spec's pull API over HTTP(S) (extra CA certificates with
//! [`UpstreamOptions::ca`]), with the auth registries ask for:
//!
//! - Bearer tokens (the Docker registry token spec, which distribution-spec
//!   §"Authentication" defers to, as Docker Hub, GHCR and Harbor use it): a
//!   401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…` → GET the
//!   realm with service and scope (with Basic credentials if this agent has
//!   some for the host: anonymous otherwise) → `{"token"|"access_token": …}`
//!   → retry with `Authorization: Bearer`.
//! - Basic (RFC 7617): a 401 with `WWW-Authenticate: Basic …` → retry with
//!   the host's credentials, and send them up front from then on.
//!
//! Credentials come from a file in the format of Docker's `config.json` /
//! containers-auth.json (`{"auths":{"HOST[:PORT]":{"auth":"base64(user:pass)"}}}`,
//! or `username`/`password`), never from the command line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use reqwest::header::{HeaderMap, ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};

use super::digest::{Digest, Reference};
use super::source_error::SourceError;

/// The media types asked for when the client gave no `Accept`: every manifest
/// and index type (distribution-spec "Pulling manifests": the client SHOULD
/// send the types it supports; a registry answers 404/406 to types it was not
/// asked for).
pub const DEFAULT_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// A user name and password for one registry host.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password (or an access token used as one).
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password, not even in a debug log.
        write!(f, "Credentials({}, ****)", self.username)
    }
}

/// Credentials by registry host, read from a Docker `config.json`-style file.
#[derive(Clone, Debug, Default)]
pub struct CredentialStore {
    by_host: HashMap<String, Credentials>,
}

/// The `HOST[:PORT]` of a registry URL or of a credential file's key
/// (`https://index.docker.io/v1/` → `index.docker.io`).
fn host_of(s: &str) -> &str {
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    s.split('/').next().unwrap_or(s)
}

impl CredentialStore {
    /// Read `path`: `{"auths":{"HOST":{"auth":"base64(user:password)"}}}` or
    /// `{"auths":{"HOST":{"username":…,"password":…}}}` per host.
    pub fn load(path: &Path) -> Result<CredentialStore, SourceError> {
        let bad = |why: String| {
            SourceError::Config(format!(
                "{}: {why} (want {{\"auths\": {{\"HOST:PORT\": {{\"auth\": \"base64 of user:password\"}}}}}}, as docker login writes)",
                path.display()
            ))
        };
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        CredentialStore::parse(&text).map_err(bad)
    }

    /// Parse a credential file's text.
    pub fn parse(text: &[u8]) -> Result<CredentialStore, String> {
        use base64::Engine as _;
        let v: serde_json::Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
        let auths = v["auths"].as_object().ok_or("no \"auths\" object")?;
        let mut by_host = HashMap::new();
        for (key, entry) in auths {
            let creds = if let Some(a) = entry["auth"].as_str() {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .map_err(|e| format!("{key}: auth is not base64: {e}"))?;
                let raw =
                    String::from_utf8(raw).map_err(|_| format!("{key}: auth is not UTF-8"))?;
                let (u, p) = raw
                    .split_once(':')
                    .ok_or_else(|| format!("{key}: auth is not user:password"))?;
                Credentials {
                    username: u.into(),
                    password: p.into(),
                }
            } else {
                match (entry["username"].as_str(), entry["password"].as_str()) {
                    (Some(u), Some(p)) => Credentials {
                        username: u.into(),
                        password: p.into(),
                    },
                    _ => return Err(format!("{key}: neither auth nor username and password")),
                }
            };
            by_host.insert(host_of(key).to_string(), creds);
        }
        Ok(CredentialStore { by_host })
    }

    /// The credentials for the registry at `url`, if any.
    pub fn for_url(&self, url: &str) -> Option<&Credentials> {
        self.by_host.get(host_of(url))
    }
}

/// How the registry agent reaches its upstreams.
#[derive(Clone, Debug, Default)]
pub struct UpstreamOptions {
    /// PEM files of CA certificates trusted for `https://` upstreams, on top
    /// of the public web roots.
    pub ca: Vec<PathBuf>,
    /// Credentials by registry host.
    pub credentials: CredentialStore,
}

/// An upstream registry.
#[derive(Debug)]
pub struct Upstream {
    base: String,
    http: reqwest::Client,
    tokens: Mutex<HashMap<String, String>>,
    credentials: Option<Credentials>,
    /// The registry asked for Basic auth once: send it with every request.
    basic: AtomicBool,
}

impl Upstream {
    /// A client of the registry at `base` (`http://host:port` or `https://…`),
    /// anonymous, trusting the public web roots.
    pub fn new(base: &str) -> Result<Upstream, SourceError> {
        Upstream::with(base, &UpstreamOptions::default())
    }

    /// A client of the registry at `base` with `options`.
    pub fn with(base: &str, options: &UpstreamOptions) -> Result<Upstream, SourceError> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SourceError::Config(format!(
                "upstream `{base}` must start with http:// or https://"
            )));
        }
        let mut b = reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(10));
        for ca in &options.ca {
            let pem = std::fs::read(ca)
                .map_err(|e| SourceError::Config(format!("--upstream-ca {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                SourceError::Config(format!(
                    "--upstream-ca {}: not PEM certificates: {e}",
                    ca.display()
                ))
            })?;
            if certs.is_empty() {
                return Err(SourceError::Config(format!(
                    "--upstream-ca {}: no certificate in it",
                    ca.display()
                )));
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        let http = b
            .build()
            .map_err(|e| SourceError::Config(format!("HTTP client: {e}")))?;
        Ok(Upstream {
            credentials: options.credentials.for_url(&base).cloned(),
            base,
            http,
            tokens: Mutex::new(HashMap::new()),
            basic: AtomicBool::new(false),
        })
    }

    fn basic_auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.credentials {
            Some(c) => req.basic_auth(&c.username, Some(&c.password)),
            None => req,
        }
    }

    /// An error for a 401/403 the auth flow could not get past.
    fn refused(&self, what: &str, status: StatusCode) -> SourceError {
        let hint = match &self.credentials {
            Some(c) => format!(
                "the upstream refused the credentials of user `{}` for {} from --upstream-credentials",
                c.username,
                host_of(&self.base)
            ),
            None => format!(
                "the upstream wants credentials: give --upstream-credentials with an entry for {}",
                host_of(&self.base)
            ),
        };
        SourceError::Denied(format!("{what}: {status} ({hint})"))
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The registry's `HOST[:PORT]`, as containerd names it in `ns=`.
    pub fn host(&self) -> &str {
        host_of(&self.base)
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
            } else if self.basic.load(Ordering::Relaxed) {
                req = self.basic_auth(req);
            }
            let resp = req.send().await.map_err(|e| self.unreachable(e))?;
            if resp.status() != StatusCode::UNAUTHORIZED {
                return Ok(resp);
            }
            if retried {
                return Err(self.refused(url, resp.status()));
            }
            let value = resp
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if let Some(challenge) = parse_challenge(value) {
                let token = self.token(&challenge, repo).await?;
                self.tokens
                    .lock()
                    .expect("token lock")
                    .insert(repo.to_string(), token);
            } else if is_basic_challenge(value) && self.credentials.is_some() {
                self.basic.store(true, Ordering::Relaxed);
            } else {
                return Err(self.refused(url, resp.status()));
            }
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
        // Anonymous unless this agent has credentials for the registry
        // (the token spec: the client authenticates to the token server).
        let resp = self
            .basic_auth(self.http.get(&c.realm).query(&q))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if matches!(
            resp.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Err(self.refused(&format!("token endpoint {}", c.realm), resp.status()));
        }
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
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(SourceError::Denied(format!(
            "{url}: {} (the upstream refuses this agent: check --upstream-credentials)",
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

/// Whether a `WWW-Authenticate` value is a Basic challenge (RFC 7617 §2;
/// the scheme is case-insensitive).
fn is_basic_challenge(v: &str) -> bool {
    v.trim_start()
        .get(..6)
        .is_some_and(|s| s.eq_ignore_ascii_case("basic "))
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
        assert!(is_basic_challenge("Basic realm=\"Registry Realm\""));
        assert!(is_basic_challenge("basic realm=x"));
        assert!(!is_basic_challenge("Bearer realm=x"));
    }

    #[test]
    fn credential_files() {
        let s = CredentialStore::parse(
            br#"{"auths":{"https://index.docker.io/v1/":{"auth":"dXNlcjpwYTpzcw=="},
                "r.example:5000":{"username":"u2","password":"p2"}}}"#,
        )
        .unwrap();
        let hub = s.for_url("https://index.docker.io").unwrap();
        assert_eq!(
            (hub.username.as_str(), hub.password.as_str()),
            ("user", "pa:ss")
        );
        assert_eq!(s.for_url("http://r.example:5000/").unwrap().username, "u2");
        assert!(s.for_url("https://r.example").is_none());
        assert!(!format!("{hub:?}").contains("pa:ss"), "no password in logs");
        for bad in [
            &b"{}"[..],
            br#"{"auths":{"h":{"auth":"!!"}}}"#,
            br#"{"auths":{"h":{}}}"#,
        ] {
            assert!(CredentialStore::parse(bad).is_err());
        }
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
