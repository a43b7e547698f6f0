//! Which repositories reference which blobs (OCI distribution spec: a blob is
//! reachable under repository R only if R links it), as confirmed once by
//! whoever may say so — the upstream registry, an image layout's manifests,
//! the registry agent — and remembered, bounded.
//!
//! Stores key blobs by digest alone (a blob is the same bytes under any name),
//! so without this a blob fetched for one repository would be served under
//! every repository name.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::digest::Digest;

/// Confirmed (repository, digest) pairs, the oldest forgotten first beyond a bound.
#[derive(Debug)]
pub struct References {
    max: usize,
    inner: Mutex<Memo>,
}

#[derive(Debug, Default)]
struct Memo {
    /// Per digest, the repositories confirmed (few: looked up without allocating).
    by_digest: HashMap<Digest, Vec<String>>,
    order: VecDeque<(Digest, String)>,
}

impl References {
    /// Pairs remembered by default: a forgotten one is only confirmed again.
    pub const DEFAULT_MAX: usize = 1 << 16;

    /// An empty memo of at most `max` pairs.
    pub fn new(max: usize) -> References {
        References {
            max: max.max(1),
            inner: Mutex::default(),
        }
    }

    /// Whether `repo` was confirmed to reference `d`.
    pub fn contains(&self, repo: &str, d: &Digest) -> bool {
        let m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        m.by_digest
            .get(d)
            .is_some_and(|repos| repos.iter().any(|r| r == repo))
    }

    /// Remember that `repo` references `d`.
    pub fn insert(&self, repo: &str, d: &Digest) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let repos = m.by_digest.entry(*d).or_default();
        if repos.iter().any(|r| r == repo) {
            return;
        }
        repos.push(repo.to_owned());
        m.order.push_back((*d, repo.to_owned()));
        while m.order.len() > self.max {
            let Some((old_d, old_repo)) = m.order.pop_front() else {
                break;
            };
            if let Some(repos) = m.by_digest.get_mut(&old_d) {
                repos.retain(|r| *r != old_repo);
                if repos.is_empty() {
                    m.by_digest.remove(&old_d);
                }
            }
        }
    }
}

impl Default for References {
    fn default() -> Self {
        References::new(Self::DEFAULT_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_per_repository_and_bounded() {
        let r = References::new(2);
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        r.insert("x", &a);
        assert!(r.contains("x", &a));
        assert!(!r.contains("y", &a), "another repository");
        r.insert("x", &b);
        r.insert("y", &a);
        assert!(!r.contains("x", &a), "the oldest is forgotten");
        assert!(r.contains("x", &b) && r.contains("y", &a));
    }
}
