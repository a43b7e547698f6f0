//! The payloads: one seeded pattern block repeated, so every row sends the same
//! bytes and the expected sha256 is known before the clock starts.

use sha2::{Digest, Sha256};

/// Size of the repeated pattern block.
pub const BLOCK: usize = 4 << 20;

/// The pattern block (xorshift bytes from a fixed seed).
pub fn pattern() -> Vec<u8> {
    let mut buf = vec![0u8; BLOCK];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    buf
}

/// The slice of the stream at `offset` (at most `max` bytes, never crossing a block end).
pub fn slice_at(pattern: &[u8], offset: u64, max: usize) -> &[u8] {
    let start = (offset % pattern.len() as u64) as usize;
    let end = pattern.len().min(start + max);
    &pattern[start..end]
}

/// [`slice_at`] without the copy: a shared slice of `pattern`, at most `max`
/// bytes and no further than `limit` (the transfer's end) from `offset`.
pub fn bytes_at(pattern: &bytes::Bytes, offset: u64, max: usize, limit: u64) -> bytes::Bytes {
    let start = (offset % pattern.len() as u64) as usize;
    let end = pattern
        .len()
        .min(start + max)
        .min(start + (limit - offset).min(usize::MAX as u64) as usize);
    pattern.slice(start..end)
}

/// sha256 of the first `len` bytes of the repeated pattern.
pub fn expected_digest(pattern: &[u8], len: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut off = 0;
    while off < len {
        let s = slice_at(pattern, off, (len - off).min(usize::MAX as u64) as usize);
        let s = &s[..s.len().min((len - off) as usize)];
        h.update(s);
        off += s.len() as u64;
    }
    h.finalize().into()
}

/// sha256 of a buffer.
pub fn digest(buf: &[u8]) -> [u8; 32] {
    Sha256::digest(buf).into()
}

/// Where a receiver puts the stream: a pre-touched buffer of the whole transfer
/// (hashed after the clock stops), or a small scratch buffer (no verification:
/// for instruction counting, where hashing would swamp the transport).
#[derive(Debug)]
pub struct SinkBuf {
    buf: Vec<u8>,
    keep: bool,
    len: usize,
    received: u64,
    overrun: [u8; 64],
}

impl SinkBuf {
    /// A sink for `total` bytes; `verify` keeps them all for the digest.
    pub fn new(total: u64, verify: bool) -> Self {
        let size = if verify { total as usize } else { 256 << 10 };
        let mut buf = vec![0u8; if verify { size } else { size.max(64 << 10) }];
        // Touch every page now so page faults are not charged to the transfer.
        for p in buf.chunks_mut(4096) {
            p[0] = 1;
        }
        SinkBuf {
            buf,
            keep: verify,
            len: 0,
            received: 0,
            overrun: [0; 64],
        }
    }

    /// Where the next read goes. Once a verifying sink is full this is a small
    /// scratch area past the kept bytes: anything landing there is an overrun.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.keep && self.len < self.buf.len() {
            let end = self.buf.len().min(self.len + (1 << 20));
            &mut self.buf[self.len..end]
        } else if self.keep {
            &mut self.overrun
        } else {
            let n = self.buf.len().min(1 << 20);
            &mut self.buf[..n]
        }
    }

    /// `n` bytes were written into [`SinkBuf::spare`].
    pub fn advance(&mut self, n: usize) {
        self.received += n as u64;
        if self.keep {
            self.len = (self.len + n).min(self.buf.len());
        }
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// A verifying sink received more than it was sized for.
    pub fn overrun(&self) -> bool {
        self.keep && self.received > self.buf.len() as u64
    }

    /// sha256 of what was kept (`None` when not verifying).
    pub fn digest(&self) -> Option<[u8; 32]> {
        self.keep.then(|| digest(&self.buf[..self.len]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_digest_matches_contiguous_stream() {
        let p = pattern();
        let len = BLOCK as u64 + 12345;
        let mut all = Vec::new();
        let mut off = 0;
        while off < len {
            let s = slice_at(&p, off, 100_000);
            let s = &s[..s.len().min((len - off) as usize)];
            all.extend_from_slice(s);
            off += s.len() as u64;
        }
        assert_eq!(expected_digest(&p, len), digest(&all));
    }
}
