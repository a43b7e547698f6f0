//! Platforms (image-spec "Image Index", `platform`: `os`, `architecture`,
//! `variant`) and how an index entry is chosen for one: the same OS and
//! architecture, and the same variant when one is asked for (arm64's default
//! variant `v8` also matches an entry that names none, as containerd's
//! platform matcher does).

use std::fmt;
use std::str::FromStr;

/// An OS, architecture and optional variant, as in an index's `platform`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// `linux`, `windows`, … (Go's GOOS values).
    pub os: String,
    /// `amd64`, `arm64`, `arm`, … (Go's GOARCH values).
    pub architecture: String,
    /// `v7`, `v8`, … when the architecture has variants.
    pub variant: Option<String>,
}

/// Why a platform string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlatformError {
    /// Not `os/arch[/variant]`.
    #[error("`{0}` is not a platform: give os/arch[/variant], e.g. linux/amd64 or linux/arm/v7")]
    Syntax(String),
}

impl Platform {
    /// The platform this program runs on, named as images name it.
    pub fn host() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            other => other,
        };
        Platform {
            os: std::env::consts::OS.into(),
            architecture: architecture.into(),
            variant: None,
        }
    }

    /// Whether an index entry's `platform` object is this platform.
    pub fn matches(&self, p: &serde_json::Value) -> bool {
        if p["os"] != self.os.as_str() || p["architecture"] != self.architecture.as_str() {
            return false;
        }
        let Some(want) = &self.variant else {
            return true;
        };
        match p["variant"].as_str() {
            Some(v) => v == want,
            None => self.architecture == "arm64" && want == "v8",
        }
    }

    /// The platform an index entry names, for messages (`unknown` if none).
    pub fn describe(p: &serde_json::Value) -> String {
        let mut s = format!(
            "{}/{}",
            p["os"].as_str().unwrap_or("unknown"),
            p["architecture"].as_str().unwrap_or("unknown")
        );
        if let Some(v) = p["variant"].as_str() {
            s.push('/');
            s.push_str(v);
        }
        s
    }
}

impl FromStr for Platform {
    type Err = PlatformError;
    fn from_str(s: &str) -> Result<Platform, PlatformError> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok =
            |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
        match parts[..] {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: os.into(),
                architecture: arch.into(),
                variant: None,
            }),
            [os, arch, variant] if ok(os) && ok(arch) && ok(variant) => Ok(Platform {
                os: os.into(),
                architecture: arch.into(),
                variant: Some(variant.into()),
            }),
            _ => Err(PlatformError::Syntax(s.chars().take(100).collect())),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_and_match() {
        let arm7: Platform = "linux/arm/v7".parse().unwrap();
        assert_eq!(arm7.to_string(), "linux/arm/v7");
        assert!(arm7.matches(&json!({"os":"linux","architecture":"arm","variant":"v7"})));
        assert!(!arm7.matches(&json!({"os":"linux","architecture":"arm","variant":"v6"})));
        assert!(!arm7.matches(&json!({"os":"linux","architecture":"arm"})));
        let amd: Platform = "linux/amd64".parse().unwrap();
        assert!(amd.matches(&json!({"os":"linux","architecture":"amd64"})));
        assert!(!amd.matches(&json!({"os":"windows","architecture":"amd64"})));
        let arm64v8: Platform = "linux/arm64/v8".parse().unwrap();
        assert!(arm64v8.matches(&json!({"os":"linux","architecture":"arm64"})));
        for bad in ["linux", "linux/", "/amd64", "a/b/c/d", "linux/amd 64"] {
            assert!(bad.parse::<Platform>().is_err(), "{bad}");
        }
        assert_eq!(
            Platform::describe(&json!({"os":"linux","architecture":"arm","variant":"v7"})),
            "linux/arm/v7"
        );
    }
}
