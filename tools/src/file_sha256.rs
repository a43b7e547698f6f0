//! The SHA-256 of a whole file, read in 1 MiB pieces off the async threads'
//! way (positional reads, no shared cursor): what the image cache's scrub and
//! the KV relay's kept-snapshot check both verify data at rest with.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use sha2::{Digest as _, Sha256};

/// The digest of all of `f` and the bytes read, at most `rate` bytes a
/// second if given (sleeping the calling, blocking thread between pieces).
pub fn sha256_file(f: &File, rate: Option<u64>) -> io::Result<([u8; 32], u64)> {
    let started = std::time::Instant::now();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = f.read_at(&mut buf, at)?;
        if n == 0 {
            return Ok((h.finalize().into(), at));
        }
        h.update(&buf[..n]);
        at += n as u64;
        if let Some(rate) = rate {
            let due = std::time::Duration::from_secs_f64(at as f64 / rate.max(1) as f64);
            std::thread::sleep(due.saturating_sub(started.elapsed()));
        }
    }
}
