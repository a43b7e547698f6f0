//! When a server answers a connection attempt with a Retry (address
//! validation, RFC 9000 §8.1.2), shared by the engine and the quinn adapter.
//!
//! A Retry is stateless: the server keeps nothing and sends one small packet,
//! and the client comes back with a token that proves its address. It costs a
//! real client one round trip, so by default ([`RetryPolicy::Auto`]) a server
//! asks for it only while many handshakes from unvalidated addresses are in
//! flight: a flood of spoofed Initials then creates no connection state, and a
//! real client still gets in within a round trip.

use std::fmt;
use std::str::FromStr;

/// When to answer an attempt from an unvalidated address with a Retry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryPolicy {
    /// Only while at least [`RetryPolicy::AUTO_THRESHOLD`] handshakes from
    /// unvalidated addresses are in flight.
    #[default]
    Auto,
    /// Every attempt whose address is not validated yet.
    Always,
    /// Never (a spoofed flood then holds handshake state until it times out).
    Never,
}

impl RetryPolicy {
    /// Handshakes from unvalidated addresses in flight at which
    /// [`RetryPolicy::Auto`] starts asking for Retry. A real client's handshake
    /// lasts a round trip or two, so a healthy server rarely has this many at
    /// once; a spoofed flood reaches it within milliseconds.
    pub const AUTO_THRESHOLD: usize = 64;

    /// Whether to answer an attempt with a Retry: its address is not
    /// validated (`address_validated`, from a token), a Retry is possible
    /// (`may_retry`: it did not already come with one), and the policy asks
    /// for it given `unvalidated_handshakes` in flight.
    pub fn should_retry(
        self,
        address_validated: bool,
        may_retry: bool,
        unvalidated_handshakes: usize,
    ) -> bool {
        !address_validated
            && may_retry
            && match self {
                RetryPolicy::Auto => unvalidated_handshakes >= Self::AUTO_THRESHOLD,
                RetryPolicy::Always => true,
                RetryPolicy::Never => false,
            }
    }

    /// The policy's name as `FromStr` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryPolicy::Auto => "auto",
            RetryPolicy::Always => "always",
            RetryPolicy::Never => "never",
        }
    }
}

impl fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A retry policy name that is none of `auto`, `always`, `never`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownRetryPolicy(pub String);

impl fmt::Display for UnknownRetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown retry policy `{}`: use auto (Retry while many handshakes \
             are unvalidated), always or never",
            self.0
        )
    }
}

impl std::error::Error for UnknownRetryPolicy {}

impl FromStr for RetryPolicy {
    type Err = UnknownRetryPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(RetryPolicy::Auto),
            "always" => Ok(RetryPolicy::Always),
            "never" => Ok(RetryPolicy::Never),
            _ => Err(UnknownRetryPolicy(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_retries_only_under_load_and_never_a_validated_attempt() {
        let t = RetryPolicy::AUTO_THRESHOLD;
        assert!(!RetryPolicy::Auto.should_retry(false, true, t - 1));
        assert!(RetryPolicy::Auto.should_retry(false, true, t));
        assert!(!RetryPolicy::Auto.should_retry(true, true, t));
        assert!(!RetryPolicy::Auto.should_retry(false, false, t));
        assert!(RetryPolicy::Always.should_retry(false, true, 0));
        assert!(!RetryPolicy::Always.should_retry(true, false, 0));
        assert!(!RetryPolicy::Never.should_retry(false, true, usize::MAX));
    }

    #[test]
    fn names_round_trip_and_unknown_ones_say_what_is_allowed() {
        for p in [RetryPolicy::Auto, RetryPolicy::Always, RetryPolicy::Never] {
            assert_eq!(p.to_string().parse::<RetryPolicy>(), Ok(p));
        }
        assert_eq!("ALWAYS".parse::<RetryPolicy>(), Ok(RetryPolicy::Always));
        let e = "sometimes".parse::<RetryPolicy>().unwrap_err();
        assert!(e.to_string().contains("auto"), "{e}");
    }
}
