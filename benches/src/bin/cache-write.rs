//! How the image cache should write a blob: chunks arrive as
//! buffers of up to 4 MiB and are written at their offsets, then the file is
//! made durable before it is renamed into the cache. Compared, each to
//! durable (final fsync included), sha256 of the file checked after:
//!
//! - `plain`: `pwrite` each chunk, one `fsync` at the end (what the cache does);
//! - `plain+sync64M`: the same plus `fdatasync` every 64 MiB, so dirty pages
//!   never pile up to the whole blob before the final flush;
//! - `direct`: `O_DIRECT` writes from 4096-aligned buffers (page cache bypassed).
//!
//! Usage: cache-write [DIR] [MIB] [CHUNK_KIB]  (defaults: /tmp, 1024, 2048)

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use sha2::{Digest, Sha256};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map_or("/tmp", String::as_str));
    let mib: usize = args.get(2).map_or(1024, |s| s.parse().expect("MIB"));
    let chunk = args
        .get(3)
        .map_or(2048, |s| s.parse::<usize>().expect("CHUNK_KIB"))
        << 10;
    let total = mib << 20;
    let mut data = vec![0u8; chunk];
    rand::Rng::fill(&mut rand::thread_rng(), &mut data[..]);
    let want = {
        let mut h = Sha256::new();
        for _ in 0..total / chunk {
            h.update(&data);
        }
        h.finalize()
    };
    // An aligned copy for O_DIRECT (no unsafe: slice a larger Vec at the
    // first 4096-aligned address).
    let mut raw = vec![0u8; chunk + 4096];
    let skew = (4096 - raw.as_ptr() as usize % 4096) % 4096;
    raw[skew..skew + chunk].copy_from_slice(&data);
    println!(
        "| cache write, {mib} MiB in {} KiB chunks, to durable | seconds | MB/s |",
        chunk >> 10
    );
    println!("|---|---|---|");
    for round in 0..2 {
        for mode in ["plain", "plain+sync64M", "direct"] {
            let path = dir.join(format!("qr-cache-write-{}-{mode}", std::process::id()));
            let mut o = OpenOptions::new();
            o.write(true).create(true).truncate(true);
            if mode == "direct" {
                o.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
            }
            let f = o.open(&path)?;
            f.set_len(total as u64)?;
            let buf: &[u8] = if mode == "direct" {
                &raw[skew..skew + chunk]
            } else {
                &data
            };
            let start = Instant::now();
            for i in 0..total / chunk {
                let off = (i * chunk) as u64;
                f.write_all_at(buf, off)?;
                if mode == "plain+sync64M" && (off + chunk as u64) % (64 << 20) == 0 {
                    f.sync_data()?;
                }
            }
            f.sync_all()?;
            let secs = start.elapsed().as_secs_f64();
            drop(f);
            let mut h = Sha256::new();
            let mut r = std::fs::File::open(&path)?;
            let mut b = vec![0u8; 1 << 20];
            loop {
                let n = r.read(&mut b)?;
                if n == 0 {
                    break;
                }
                h.update(&b[..n]);
            }
            std::fs::remove_file(&path)?;
            assert_eq!(
                h.finalize(),
                want,
                "{mode}: the file does not hash to what was written"
            );
            if round == 1 {
                println!("| {mode} | {secs:.2} | {:.0} |", total as f64 / secs / 1e6);
            }
        }
    }
    Ok(())
}
