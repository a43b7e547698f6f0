//! Replicas authenticate to the downstream relay as they would to a Redis
//! master: with `masterauth` (and `masteruser` for an ACL user) the replica
//! sends `AUTH [username] password` after its first PING, and a master that
//! requires a password answers everything else with `-NOAUTH` (Redis
//! replication handshake; Redis 6 ACL `AUTH`). Without it the relay would
//! hand its whole dataset to any TCP client that sends `PSYNC ? -1`.
//!
//! The other way, [`Credentials`] are what the upstream relay presents to
//! the Redis servers and Sentinels it asks.

use std::fmt;

use super::conn::RedisConn;
use super::error::RelayError;

/// The credentials replicas must present.
#[derive(Clone)]
pub struct ReplicaAuth {
    user: String,
    password: Vec<u8>,
}

impl fmt::Debug for ReplicaAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// `AUTH` without a user name authenticates as this one (as in Redis).
pub const DEFAULT_USER: &str = "default";

impl ReplicaAuth {
    /// Replicas must send `AUTH user password` (or `AUTH password` when
    /// `user` is `None` or [`DEFAULT_USER`]).
    pub fn new(user: Option<String>, password: impl Into<Vec<u8>>) -> Self {
        Self {
            user: user.unwrap_or_else(|| DEFAULT_USER.to_string()),
            password: password.into(),
        }
    }

    /// Whether `AUTH`'s arguments (`[user] password`) match, compared in time
    /// independent of where they differ.
    pub fn check(&self, user: Option<&[u8]>, password: &[u8]) -> bool {
        let user = user.unwrap_or(DEFAULT_USER.as_bytes());
        // Both comparisons always run: neither result short-cuts the other.
        let u = crate::secret::equal(user, self.user.as_bytes());
        let p = crate::secret::equal(password, &self.password);
        u & p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_as_redis_takes_it() {
        let a = ReplicaAuth::new(None, "s3cret");
        assert!(a.check(None, b"s3cret"));
        assert!(a.check(Some(b"default"), b"s3cret"));
        assert!(!a.check(None, b"s3cre"));
        assert!(!a.check(None, b"s3cret!"));
        assert!(!a.check(Some(b"other"), b"s3cret"));
        let acl = ReplicaAuth::new(Some("replica".into()), "pw");
        assert!(acl.check(Some(b"replica"), b"pw"));
        assert!(!acl.check(None, b"pw"));
        assert!(!format!("{acl:?}").contains("pw\""));
    }
}

/// Credentials for `AUTH`: an optional ACL user with its password.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// ACL user (with `password`).
    pub user: Option<String>,
    /// The password, if the server requires one.
    pub password: Option<String>,
}

impl Credentials {
    /// `AUTH` on `c` if there is a password.
    pub async fn auth(&self, c: &mut RedisConn) -> Result<(), RelayError> {
        let Some(pw) = &self.password else {
            return Ok(());
        };
        match &self.user {
            Some(u) => {
                c.command_ok(&[b"AUTH", u.as_bytes(), pw.as_bytes()])
                    .await?
            }
            None => c.command_ok(&[b"AUTH", pw.as_bytes()]).await?,
        };
        Ok(())
    }
}
