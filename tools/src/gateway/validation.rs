//! Whether a gateway client has proved its address, and what it may be sent
//! until it has (RFC 9000 §8.1) — the same account the endpoints' peer table
//! keeps ([`quic_rdma::quic::Budget`]), here for what the gateway
//! forwards.
//!
//! A forged source never sees the server's answers, so it cannot name the
//! connection ID the server chose (the source CID of the server's long
//! headers); a real client does in its next long header (a Handshake packet,
//! or an Initial after a Retry). Until then the gateway forwards to the client
//! at most 3× what it received from it, counted as bytes on the wire.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use quic_rdma::quic::{Budget, CidKey};

/// One client's validation state, shared by the task reading the client and
/// the task forwarding the server's replies to it.
#[derive(Debug)]
pub(super) struct Validation {
    validated: AtomicBool,
    budget: Mutex<Budget>,
    /// Bits of the server's CIDs that are not random (RFC 9000 §8.1 asks for
    /// 64 random bits in a CID that proves an address).
    predictable_bits: u32,
}

impl Validation {
    /// A client whose first datagram was `first`.
    pub(super) fn new(first: &[u8], predictable_bits: u32) -> Self {
        let mut budget = Budget::default();
        budget.heard(first);
        Validation {
            validated: AtomicBool::new(false),
            budget: Mutex::new(budget),
            predictable_bits,
        }
    }

    /// Whether the client has proved its address.
    pub(super) fn is_validated(&self) -> bool {
        self.validated.load(Ordering::Relaxed)
    }

    /// Account for `datagram` from the client (after its first); `true` if it
    /// proves the client's address.
    pub(super) fn heard_from_client(&self, datagram: &[u8], key: &CidKey) -> bool {
        if self.is_validated() {
            return false;
        }
        let mut b = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        b.heard(datagram);
        b.proves_address(datagram, key, self.predictable_bits)
    }

    /// The client is validated: forward everything from now on.
    pub(super) fn set_validated(&self) {
        self.validated.store(true, Ordering::Relaxed);
    }

    /// Whether `datagram` from the server may be forwarded to the client
    /// (always, once validated); remembers the CID the server chose.
    pub(super) fn to_client(&self, datagram: &[u8], key: &CidKey) -> bool {
        if self.is_validated() {
            return true;
        }
        let mut b = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        b.issue(datagram, key);
        b.allow(datagram.len(), None) == datagram.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(first: u8, dcid: &[u8], scid: &[u8], len: usize) -> Vec<u8> {
        let mut p = vec![first, 0, 0, 0, 1, dcid.len() as u8];
        p.extend_from_slice(dcid);
        p.push(scid.len() as u8);
        p.extend_from_slice(scid);
        p.resize(len, 0);
        p
    }

    #[test]
    fn three_times_until_the_client_names_the_servers_cid() {
        let key = CidKey::default();
        let v = Validation::new(&long(0xC0, &[1; 8], &[2; 8], 1200), 0);
        let server = [9u8; 8];
        // 3 × 1 200 bytes: two 1 500-byte datagrams fit, a third does not.
        let reply = long(0xC0, &[2; 8], &server, 1500);
        assert!(v.to_client(&reply, &key));
        assert!(v.to_client(&reply, &key));
        assert!(!v.to_client(&reply, &key));
        // A packet to some other CID proves nothing (and earns budget).
        assert!(!v.heard_from_client(&long(0xE0, &[3; 8], &[2; 8], 60), &key));
        assert!(v.heard_from_client(&long(0xE0, &server, &[2; 8], 60), &key));
        v.set_validated();
        assert!(v.is_validated());
        for _ in 0..10 {
            assert!(v.to_client(&reply, &key));
        }
    }
}
