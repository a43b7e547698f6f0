//! Secrets given to `qr` (a KV replica password, a metrics bearer token):
//! read from a file's first line, never from the command line (where `ps`
//! shows them), and compared in time that does not depend on where a guess
//! goes wrong.

use std::path::Path;

use anyhow::{bail, Context as _};

/// The first line of `path`, which must not be empty; `what` names the
/// option in the error.
pub(crate) fn read_first_line(path: &Path, what: &str) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("{what} {}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim_end();
    if line.is_empty() {
        bail!(
            "{what} {}: the first line is empty; put the secret there",
            path.display()
        );
    }
    Ok(line.to_string())
}

/// Equal bytes, in time that depends only on the lengths.
pub(crate) fn equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_line_and_equality() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        std::fs::write(&f, "tok en\r\nsecond\n").unwrap();
        assert_eq!(read_first_line(&f, "--x").unwrap(), "tok en");
        std::fs::write(&f, "\nx\n").unwrap();
        assert!(read_first_line(&f, "--x")
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(read_first_line(&dir.path().join("none"), "--x")
            .unwrap_err()
            .to_string()
            .starts_with("--x "));
        assert!(equal(b"abc", b"abc"));
        assert!(!equal(b"abc", b"abd"));
        assert!(!equal(b"abc", b"abcd"));
    }
}
