//! Why a registry agent's source could not give an object: one error for
//! the upstream registries ([`super::upstream`]) and the image-layout
//! directory ([`super::source`]). A module of its own because both produce it
//! and the source uses the upstream client: with the error in either, the two
//! would import each other.

use super::digest::Digest;

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
    /// The upstream refused this agent (credentials missing or wrong).
    #[error("upstream refused: {0}")]
    Denied(String),
    /// The agent's configuration is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// A local file operation failed (layout directory, spool).
    #[error("local I/O: {0}")]
    Io(String),
}
