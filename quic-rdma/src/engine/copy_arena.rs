//! Copies into one shared buffer, so handing quinn-proto owned bytes costs
//! no allocation per packet or per write.
//!
//! quinn-proto takes owned buffers: `Endpoint::handle` a `BytesMut` per
//! received datagram, `SendStream::write_chunks` and `Datagrams::send` a
//! `Bytes` per write. Each is a copy out of memory the caller keeps (a
//! registered receive buffer that is reposted, the application's slice).
//! Copied into a [`CopyArena`], each is a slice of one chunk (`BytesMut::split`):
//! once every slice of the chunk is dropped (read by the application, or
//! acknowledged by the peer) the chunk is reclaimed in place, and a new one
//! is allocated only while an old slice is still held.

use bytes::BytesMut;

/// One chunk at a time, cut into the copies handed out.
#[derive(Debug)]
pub(crate) struct CopyArena {
    buf: BytesMut,
    chunk: usize,
}

impl CopyArena {
    /// An arena of `chunk`-byte chunks (the first allocated now).
    pub(crate) fn new(chunk: usize) -> Self {
        CopyArena {
            buf: BytesMut::with_capacity(chunk),
            chunk,
        }
    }

    /// `data` copied into the current chunk. When it has no room left, it
    /// is reclaimed if no earlier copy is still held, else a new chunk is
    /// allocated (`BytesMut::reserve`).
    pub(crate) fn copy(&mut self, data: &[u8]) -> BytesMut {
        if self.buf.capacity() < data.len() {
            self.buf.reserve(self.chunk.max(data.len()));
        }
        self.buf.extend_from_slice(data);
        self.buf.split()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_exact_and_independent() {
        let mut a = CopyArena::new(64);
        let x = a.copy(b"hello").freeze();
        let y = a.copy(&[7; 40]);
        let z = a.copy(&[9; 100]); // more than a chunk: its own allocation
        assert_eq!(&x[..], b"hello");
        assert_eq!(&y[..], &[7; 40][..]);
        assert_eq!(&z[..], &[9; 100][..]);
        assert_eq!(a.copy(&[]).len(), 0);
    }

    #[test]
    fn a_chunk_is_reused_once_its_copies_are_dropped() {
        let mut a = CopyArena::new(256);
        let first = a.copy(&[1; 200]);
        let base = first.as_ptr();
        drop(first);
        // No room for 100 more: the chunk is unique again, so reclaimed.
        let again = a.copy(&[2; 100]);
        assert_eq!(again.as_ptr(), base);
        // Held: the next copy that does not fit goes to a new chunk, and the
        // held one keeps its bytes.
        let more = a.copy(&[3; 200]);
        assert_ne!(more.as_ptr(), base);
        assert_eq!(&again[..], &[2; 100][..]);
        assert_eq!(&more[..], &[3; 200][..]);
    }
}
