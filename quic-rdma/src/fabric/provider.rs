//! The providers by name: what `qr --provider`, the C API's
//! `qr_fabric_config.provider` and the benchmarks' `--provider` mean.

use std::fmt;
use std::str::FromStr;

/// A fabric provider (docs/architecture.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    /// The in-process simulated fabric ([`crate::fabric::sim`]).
    Sim,
    /// Userspace RoCEv2 over UDP sockets ([`crate::fabric::soft`]).
    Soft,
    /// libibverbs: RoCE NICs and kernel rxe (cargo feature `verbs`).
    Verbs,
}

impl Provider {
    /// Every provider, in the order they are listed to users.
    pub const ALL: [Provider; 3] = [Provider::Sim, Provider::Soft, Provider::Verbs];

    /// The name used on command lines, in configs and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Sim => "sim",
            Provider::Soft => "soft",
            Provider::Verbs => "verbs",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A provider name that is none of [`Provider::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown provider {0:?}: use sim, soft or verbs")]
pub struct UnknownProvider(pub String);

impl FromStr for Provider {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Provider, UnknownProvider> {
        Provider::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownProvider(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Provider::ALL {
            assert_eq!(p.to_string().parse::<Provider>(), Ok(p));
        }
        let e = "rxe".parse::<Provider>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown provider \"rxe\": use sim, soft or verbs"
        );
    }
}
