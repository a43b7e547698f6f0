//! GRO for the adapter: datagrams handed to quinn several per receive entry.

use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr};

use quinn::udp::{EcnCodepoint, RecvMeta};

use crate::socket::Received;

/// Datagrams per [`RecvMeta`] handed to quinn (like UDP GRO's segments): quinn
/// sizes its receive buffer as MTU × this × its batch of 32 (2 MiB at MTU 4096).
pub(super) const RECV_SEGMENTS: usize = 16;

/// Fills quinn's receive buffers GRO-style: a datagram joins the previous entry
/// when it comes from the same peer with the same ECN, is no longer than that
/// entry's stride, the entry's last datagram is full-stride (only the last may
/// be shorter) and there is room; otherwise it starts a new entry.
pub(super) struct Coalescer<'a, 'b> {
    bufs: &'a mut [IoSliceMut<'b>],
    meta: &'a mut [RecvMeta],
    /// Entries filled.
    used: usize,
    /// Datagrams in the last entry.
    segments: usize,
}

impl<'a, 'b> Coalescer<'a, 'b> {
    /// Empty, over quinn's buffers and their metadata.
    pub(super) fn new(bufs: &'a mut [IoSliceMut<'b>], meta: &'a mut [RecvMeta]) -> Self {
        Coalescer {
            bufs,
            meta,
            used: 0,
            segments: 0,
        }
    }

    /// Entries filled (what `poll_recv` returns).
    pub(super) fn used(&self) -> usize {
        self.used
    }

    /// Add one datagram from `addr` (its source as quinn knows it); the caller
    /// never hands more datagrams than entries left, so there is always room
    /// for a new entry.
    pub(super) fn push(&mut self, r: &Received<'_>, addr: SocketAddr, dst_ip: Option<IpAddr>) {
        let ecn = EcnCodepoint::from_bits(r.ecn);
        if let Some(i) = self.used.checked_sub(1) {
            let m = &mut self.meta[i];
            let joins = m.addr == addr
                && m.ecn == ecn
                && m.len == self.segments * m.stride
                && r.data.len() <= m.stride
                && !r.data.is_empty()
                && self.segments < RECV_SEGMENTS
                && m.len + r.data.len() <= self.bufs[i].len();
            if joins {
                self.bufs[i][m.len..m.len + r.data.len()].copy_from_slice(r.data);
                m.len += r.data.len();
                self.segments += 1;
                return;
            }
        }
        let i = self.used;
        let len = r.data.len().min(self.bufs[i].len());
        self.bufs[i][..len].copy_from_slice(&r.data[..len]);
        self.meta[i] = RecvMeta {
            addr,
            len,
            stride: len,
            ecn,
            dst_ip,
        };
        self.used += 1;
        self.segments = 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Gid, UdAddr};

    fn ud(n: u16) -> UdAddr {
        UdAddr::new(
            Gid::from(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n)),
            7,
            0x1111,
        )
    }

    fn rx(src: UdAddr, ecn: u8, data: &[u8]) -> Received<'_> {
        Received {
            src,
            ecn,
            imm: None,
            data,
            timestamp: None,
        }
    }

    #[test]
    fn runs_from_one_peer_share_an_entry_until_a_short_one() {
        let mut storage = [[0u8; 64]; 4];
        let mut bufs: Vec<IoSliceMut<'_>> = storage
            .iter_mut()
            .map(|b| IoSliceMut::new(&mut b[..]))
            .collect();
        let mut meta = [RecvMeta::default(); 4];
        let mut out = Coalescer::new(&mut bufs, &mut meta);
        let addr = |u: UdAddr| SocketAddr::new(u.gid.to_ipv6().into(), 1);
        let (a, b) = (ud(1), ud(2));
        // a: 16, 16, 8 (closes), 16 (new entry); b: 16; a with ECN 1: 16.
        for (src, ecn, fill, len) in [
            (a, 0, 1, 16),
            (a, 0, 2, 16),
            (a, 0, 3, 8),
            (a, 0, 4, 16),
            (b, 0, 5, 16),
            (a, 1, 6, 16),
        ] {
            out.push(&rx(src, ecn, &[fill; 16][..len]), addr(src), None);
        }
        assert_eq!(out.used(), 4);
        let m: Vec<(usize, usize)> = meta.iter().map(|m| (m.len, m.stride)).collect();
        assert_eq!(m, [(40, 16), (16, 16), (16, 16), (16, 16)]);
        let first: Vec<u8> = [[1u8; 16].as_slice(), &[2; 16], &[3; 8]].concat();
        assert_eq!(storage[0][..40], first[..]);
        assert_eq!((storage[1][0], storage[2][0], storage[3][0]), (4, 5, 6));
        assert_eq!(meta[3].ecn, EcnCodepoint::from_bits(1));
    }

    #[test]
    fn an_entry_holds_what_its_buffer_holds() {
        let mut storage = [[0u8; 40]; 2];
        let mut bufs: Vec<IoSliceMut<'_>> = storage
            .iter_mut()
            .map(|b| IoSliceMut::new(&mut b[..]))
            .collect();
        let mut meta = [RecvMeta::default(); 2];
        let mut out = Coalescer::new(&mut bufs, &mut meta);
        let addr = |u: UdAddr| SocketAddr::new(u.gid.to_ipv6().into(), 1);
        for i in 0..3u8 {
            out.push(&rx(ud(1), 0, &[i; 16]), addr(ud(1)), None);
        }
        assert_eq!(out.used(), 2);
        assert_eq!((meta[0].len, meta[1].len), (32, 16));
        assert_eq!(storage[1][..16], [2u8; 16]);
    }
}
