//! Blobs whose streamed fetch failed recently: the node agent answers their
//! next requests whole (with the error if it fails again) instead of cutting
//! another stream short ([`super::cut_through`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::digest::Digest;

/// How long after a streamed fetch of a blob failed its requests are
/// answered whole (with the error, if it fails again).
pub const FAILED_FOR: Duration = Duration::from_secs(60);

/// Blobs whose streamed fetch failed recently (bounded: the oldest go first).
#[derive(Debug, Default)]
pub struct Failures(Mutex<HashMap<Digest, Instant>>);

impl Failures {
    /// Note that a streamed fetch of `d` failed now.
    pub fn note(&self, d: Digest) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        m.retain(|_, at| now.duration_since(*at) < FAILED_FOR);
        if m.len() < 4096 {
            m.insert(d, now);
        }
    }

    /// Whether a streamed fetch of `d` failed within [`FAILED_FOR`].
    pub fn recent(&self, d: &Digest) -> bool {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(d).is_some_and(|at| at.elapsed() < FAILED_FOR)
    }
}
