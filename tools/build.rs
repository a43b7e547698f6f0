//! `qr --version` names the git revision it was built from (or "unknown"
//! outside a git checkout, e.g. from a source tarball).

use std::path::Path;
use std::process::Command;

fn main() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=QR_GIT_REVISION={rev}");
    // Rebuild the version string when HEAD moves (a commit or a checkout).
    let git = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.git");
    for f in ["HEAD", "index"] {
        let p = git.join(f);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
}
