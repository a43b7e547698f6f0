//! `qr pull IMAGE`: pull an image from a `qr registry-agent` over the fabric
//! with the node agent's library (no HTTP hop), a progress bar per blob, and
//! a summary of bytes, time, throughput and the path each blob took
//! (`--json` for scripts). `--out DIR` writes an OCI image layout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::node_agent::{node, NodeStoreArgs};
use crate::identity::Identity;
use crate::image::digest::{check_name, check_namespace, scoped, Digest, Reference};
use crate::image::node::Node;
use crate::image::platform::Platform;
use crate::image::transfer::TransferOptions;

/// Options of `qr pull`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct PullArgs {
    /// The image: REPOSITORY[:TAG] or REPOSITORY@sha256:… (TAG defaults to latest).
    image: String,

    #[command(flatten)]
    store: NodeStoreArgs,

    /// Write the image as an OCI image layout into this directory.
    #[arg(long)]
    out: Option<PathBuf>,

    /// The platform an image index is resolved for: os/arch[/variant]
    /// (default: this host's, e.g. linux/amd64). An index with no entry for
    /// it is an error that lists the platforms it has.
    #[arg(long, value_parser = |s: &str| s.parse::<Platform>().map_err(|e| e.to_string()))]
    platform: Option<Platform>,

    /// Print the summary as one JSON object (no progress bars).
    #[arg(long)]
    json: bool,
}

/// Run `qr pull`: 0 when every blob arrived verified, 1 otherwise.
pub(crate) fn main(args: &PullArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qr pull: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `[HOST[:PORT]/]REPOSITORY[:TAG]` or `…@DIGEST`. A first component with
/// a `.` or `:`, or `localhost`, is the registry host (Docker's reference
/// rule): the repository is then scoped to it, as containerd's `ns=` scopes
/// it, and the registry agent asks the upstream it has for that host.
fn parse_image(s: &str) -> Result<(String, Reference)> {
    let (ns, s) = match s.split_once('/') {
        Some((host, rest)) if host.contains('.') || host.contains(':') || host == "localhost" => {
            check_namespace(host)?;
            (Some(host), rest)
        }
        _ => (None, s),
    };
    let (repo, reference) = if let Some((r, d)) = s.split_once('@') {
        (r, Reference::Digest(d.parse()?))
    } else {
        match s.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, t.parse()?),
            _ => (s, Reference::Tag("latest".into())),
        }
    };
    check_name(repo)?;
    Ok((scoped(ns, repo), reference))
}

#[derive(serde::Serialize)]
struct BlobSummary {
    digest: String,
    bytes: u64,
    path: &'static str,
    seconds: f64,
}

#[derive(serde::Serialize)]
struct Summary {
    ok: bool,
    image: String,
    manifest: String,
    bytes: u64,
    seconds: f64,
    throughput_mbit_s: f64,
    blobs: Vec<BlobSummary>,
    verify_failures: u64,
    resumes: u64,
}

fn run(args: &PullArgs) -> Result<()> {
    let (repo, reference) = parse_image(&args.image)?;
    let cache = args.store.open_cache()?;
    let transfer = args.store.transfer(TransferOptions::default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async {
        let identity = Identity::load(&args.store.tls)?;
        let node = node(&args.store, &identity, cache, transfer, &[], None)?;
        let start = Instant::now();
        let platform = args.platform.clone().unwrap_or_else(Platform::host);
        let (manifest, media_type, mdigest) = resolve(&node, &repo, &reference, &platform).await?;
        let v: serde_json::Value =
            serde_json::from_slice(&manifest).context("the manifest is not JSON")?;
        let mut blobs: Vec<(Digest, u64)> = Vec::new();
        for d in std::iter::once(&v["config"]).chain(v["layers"].as_array().into_iter().flatten()) {
            let digest: Digest = d["digest"]
                .as_str()
                .unwrap_or_default()
                .parse()
                .context("a descriptor in the manifest")?;
            blobs.push((digest, d["size"].as_u64().unwrap_or(0)));
        }
        let bars = MultiProgress::new();
        if args.json {
            bars.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let style = ProgressStyle::with_template(
            "{prefix:.bold} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .expect("static template")
        .progress_chars("=> ");
        let tasks = blobs.iter().map(|(digest, size)| {
            let bar = bars.add(ProgressBar::new(*size));
            bar.set_style(style.clone());
            bar.set_prefix(digest.hex()[..12].to_string());
            let (node, repo) = (node.clone(), repo.clone());
            async move {
                let t = Instant::now();
                let mut b = node
                    .blob(&repo, digest, &|n, total| {
                        bar.set_length(total);
                        bar.set_position(n);
                    })
                    .await
                    .with_context(|| format!("blob {digest}"))?;
                // Cached before `qr pull` exits (verified already; a blob that
                // cannot be cached is only a warning).
                if let Err(e) = std::mem::take(&mut b.stored).wait().await {
                    eprintln!("qr pull: warning: blob {digest} not cached: {e}");
                }
                bar.finish_with_message(format!("verified ({})", b.path.name()));
                Ok::<_, anyhow::Error>((
                    BlobSummary {
                        digest: digest.to_string(),
                        bytes: b.size,
                        path: b.path.name(),
                        seconds: t.elapsed().as_secs_f64(),
                    },
                    b,
                ))
            }
        });
        let results = futures_util::future::join_all(tasks).await;
        let secs = start.elapsed().as_secs_f64();
        let mut done = Vec::new();
        for r in results {
            done.push(r?);
        }
        if let Some(out) = &args.out {
            write_layout(out, &reference, &manifest, &media_type, &mdigest, &done)?;
        }
        let bytes: u64 = done.iter().map(|(s, _)| s.bytes).sum();
        let summary = Summary {
            ok: true,
            image: args.image.clone(),
            manifest: mdigest.to_string(),
            bytes,
            seconds: secs,
            throughput_mbit_s: bytes as f64 * 8.0 / secs.max(1e-9) / 1e6,
            blobs: done.into_iter().map(|(s, _)| s).collect(),
            verify_failures: node.metrics.verify_failures.get(),
            resumes: node.metrics.resumes.get(),
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        } else {
            println!(
                "pulled {} ({}): {} blobs, {:.1} MiB in {:.2} s, {:.0} Mbit/s; paths: {}",
                summary.image,
                summary.manifest,
                summary.blobs.len(),
                bytes as f64 / (1 << 20) as f64,
                secs,
                summary.throughput_mbit_s,
                summary
                    .blobs
                    .iter()
                    .map(|b| b.path)
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        Ok(())
    })
}

/// The image manifest: an index is resolved to its entry for `platform`
/// ([`Platform::matches`]), as a runtime on that platform would.
async fn resolve(
    node: &Arc<Node>,
    repo: &str,
    reference: &Reference,
    platform: &Platform,
) -> Result<(bytes::Bytes, String, Digest)> {
    let mut reference = reference.clone();
    for _ in 0..2 {
        let a = tokio::time::timeout(Duration::from_secs(60), node.manifest(repo, &reference, ""))
            .await
            .context("no manifest after 60 s")??;
        let v: serde_json::Value =
            serde_json::from_slice(&a.body).context("the manifest is not JSON")?;
        let Some(ms) = v["manifests"].as_array() else {
            return Ok((a.body, a.media_type, a.digest));
        };
        let Some(pick) = ms.iter().find(|m| platform.matches(&m["platform"])) else {
            let have: Vec<String> = ms
                .iter()
                .map(|m| Platform::describe(&m["platform"]))
                .collect();
            bail!(
                "{repo}:{reference} has no image for {platform} (it has {}): give --platform",
                have.join(", ")
            );
        };
        reference = Reference::Digest(pick["digest"].as_str().unwrap_or_default().parse()?);
    }
    bail!("an index pointing at an index: not supported")
}

fn write_layout(
    out: &std::path::Path,
    reference: &Reference,
    manifest: &[u8],
    media_type: &str,
    mdigest: &Digest,
    blobs: &[(BlobSummary, crate::image::node::Blob)],
) -> Result<()> {
    let dir = out.join("blobs/sha256");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(mdigest.hex()), manifest)?;
    for (s, b) in blobs {
        let mut src = b.file.try_clone()?;
        use std::io::Seek;
        src.seek(std::io::SeekFrom::Start(0))?;
        let dest = dir.join(&s.digest[7..]);
        let mut f =
            std::fs::File::create(&dest).with_context(|| format!("creating {}", dest.display()))?;
        std::io::copy(&mut src, &mut f)?;
    }
    let tag = match reference {
        Reference::Tag(t) => t.clone(),
        Reference::Digest(_) => "latest".into(),
    };
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": media_type,
            "digest": mdigest.to_string(),
            "size": manifest.len(),
            "annotations": { "org.opencontainers.image.ref.name": tag }
        }]
    });
    std::fs::write(out.join("index.json"), index.to_string())?;
    std::fs::write(out.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        let (r, t) = parse_image("library/busybox").unwrap();
        assert_eq!(
            (r.as_str(), t),
            ("library/busybox", Reference::Tag("latest".into()))
        );
        let (_, t) = parse_image("a/b:v1.2").unwrap();
        assert_eq!(t, Reference::Tag("v1.2".into()));
        let d = Digest::of(b"x");
        let (_, t) = parse_image(&format!("a@{d}")).unwrap();
        assert_eq!(t, Reference::Digest(d));
        assert!(parse_image("A/b").is_err());
        let (r, t) = parse_image("registry.example:5000/a/b:v1").unwrap();
        assert_eq!(r, "registry.example:5000//a/b");
        assert_eq!(t, Reference::Tag("v1".into()));
        let (r, _) = parse_image("localhost/a").unwrap();
        assert_eq!(r, "localhost//a");
        assert!(parse_image("a@sha256:12").is_err());
    }
}
