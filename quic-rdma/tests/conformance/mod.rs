//! The conformance suite: one set of `UdQueuePair` checks every provider must
//! pass the same way, run by the `sim` (socket_sim), `soft` (soft_provider) and
//! `verbs` (verbs_raw, in the rxe guest) test binaries (docs/architecture.md §2).
//! Each binary instantiates the whole set with [`suite!`], so a check added
//! here runs on every provider without touching them:
//! - delivery: the GRH area carries the source GID, `byte_len` counts it, the
//!   completion names the source QPN and carries the immediate data exactly
//!   when the sender used SEND with immediate;
//! - an oversized send completes successfully and never arrives;
//! - send completions are in order: one signaled send retires the earlier
//!   unsignaled ones, and every send arrives;
//! - the error state (IBA 10.8.3: a work request completing in error moves the
//!   QP to the error state, where every later WR is flushed; IBA 10.3.1: Error →
//!   Reset → Init → RTR → RTS brings it back).
//!
//! `wait` bounds how long a packet may take to arrive, and how long a check
//! that something does *not* happen waits; `sim` completes everything inside
//! the post on a fabric without delay, so it passes `Duration::ZERO`.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use quic_rdma::fabric::{
    AhAttr, Completion, Grh, GrhLayout, Memory, RecvWr, Region, SendFlags, SendWr, Sge,
    UdQueuePair, WcStatus, GRH_LEN,
};

/// One `#[test]` per check of the suite, for one provider: `$pair(n)` makes
/// two fresh QPs that reach each other, for the `n`-th check (a provider
/// needing distinct addresses per test picks them by `n`), plus whatever must
/// outlive them; `None` skips (no device, and none required). `$wait` bounds
/// how long a packet may take to arrive (see the module docs).
macro_rules! conformance_suite {
    ($pair:path, $wait:expr) => {
        #[test]
        fn conformance_error_state_and_recovery() {
            let Some((a, b, _keep)) = $pair(0) else {
                return;
            };
            conformance::error_state_and_recovery(a, b, $wait);
        }

        #[test]
        fn conformance_delivery_semantics() {
            let Some((a, b, _keep)) = $pair(1) else {
                return;
            };
            conformance::delivery_semantics(a, b, $wait);
        }

        #[test]
        fn conformance_oversize_send_completes_and_never_arrives() {
            let Some((a, b, _keep)) = $pair(2) else {
                return;
            };
            conformance::oversize_send_completes_and_never_arrives(a, b, $wait);
        }

        #[test]
        fn conformance_one_signaled_send_retires_the_earlier_ones() {
            let Some((a, b, _keep)) = $pair(3) else {
                return;
            };
            conformance::one_signaled_send_retires_the_earlier_ones(a, b, $wait);
        }
    };
}
pub(crate) use conformance_suite as suite;

/// How many checks [`suite!`] instantiates (the `n` its pair maker sees is below it).
pub const CHECKS: usize = 4;

const SLOT: u32 = 4096 + 64;
const RECVS: u32 = 4;

/// A QP with one registered region: RECVS receive slots, then one send slot.
struct Side<Q> {
    qp: Q,
    mem: Memory,
    region: u32,
    lkey: u32,
}

impl<Q: UdQueuePair> Side<Q> {
    fn new(mut qp: Q) -> Self {
        let mut mem = Memory::new();
        let mut r = Region::new(((RECVS + 1) * SLOT) as usize);
        qp.register(&mut r).unwrap();
        let lkey = r.lkey().unwrap();
        let region = mem.push(r);
        Side {
            qp,
            mem,
            region,
            lkey,
        }
    }

    fn post_recvs(&mut self) {
        let wrs: Vec<RecvWr> = (0..RECVS)
            .map(|i| RecvWr {
                wr_id: u64::from(i),
                sge: Sge {
                    region: self.region,
                    offset: i * SLOT,
                    len: SLOT,
                    lkey: self.lkey,
                },
            })
            .collect();
        self.qp.post_recv(&mut self.mem, &wrs).unwrap();
    }

    /// Post one signaled send of `payload` to `to` with `lkey`; its completion.
    fn send(&mut self, to: &Q, payload: &[u8], lkey: u32) -> Completion {
        self.send_imm(to, payload, lkey, None)
    }

    /// [`Side::send`] with immediate data `imm` (SEND with immediate).
    fn send_imm(&mut self, to: &Q, payload: &[u8], lkey: u32, imm: Option<u32>) -> Completion {
        let off = RECVS * SLOT;
        self.mem
            .region_mut(self.region)
            .unwrap()
            .slice_mut(off as usize, payload.len())
            .expect("the send slot is not posted for receive")
            .copy_from_slice(payload);
        let ah = self.qp.create_ah(&AhAttr::new(to.attr().gid, 0)).unwrap();
        let wr = SendWr {
            wr_id: 7,
            sge: Sge {
                region: self.region,
                offset: off,
                len: payload.len() as u32,
                lkey,
            },
            ah,
            remote_qpn: to.attr().qpn,
            remote_qkey: to.attr().qkey,
            imm,
            flags: SendFlags {
                signaled: true,
                inline: false,
            },
        };
        self.qp.post_send(&self.mem, &[wr]).unwrap();
        // Hardware completes asynchronously: wait for it (bounded).
        let mut c = [Completion::send(0); 4];
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut n = 0;
        while n == 0 && Instant::now() < deadline {
            n = self.qp.poll_send_cq(&mut c);
        }
        assert_eq!(n, 1, "one completion per signaled send");
        self.qp.destroy_ah(ah).unwrap();
        c[0]
    }

    /// Receive completions polled within `wait` (stops early at `n`). Polls
    /// at least once, so a provider that completes synchronously (`sim`)
    /// passes `Duration::ZERO` and nothing sleeps.
    fn recv(&mut self, n: usize, wait: Duration) -> Vec<Completion> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        let mut c = [Completion::send(0); 16];
        loop {
            let k = self.qp.poll_recv_cq(&mut self.mem, &mut c);
            got.extend_from_slice(&c[..k]);
            if got.len() >= n || Instant::now() >= deadline {
                return got;
            }
            if k == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// `a` and `b` reach each other. A send from `a` naming no registered region
/// fails `a`: later sends are flushed and never arrive, posted receives are
/// flushed; `recover` brings `a` back with its QPN, and traffic flows both
/// ways again. `wait` bounds how long a packet may take to arrive.
pub fn error_state_and_recovery<Q: UdQueuePair>(a: Q, b: Q, wait: Duration) {
    let (mut a, mut b) = (Side::new(a), Side::new(b));
    a.post_recvs();
    b.post_recvs();
    let qpn = a.qp.attr().qpn;

    // Unregistered lkey: a local error (LocProtErr in IBA 10.6.3; kernel rxe
    // reports another local error code), and the QP fails.
    let c = a.send(&b.qp, b"bad lkey", a.lkey ^ 0x5a5a_0000);
    eprintln!("send with an unregistered lkey completed: {:?}", c.status);
    assert!(
        !matches!(c.status, WcStatus::Success | WcStatus::WrFlushErr),
        "{c:?}"
    );
    // From now on sends are flushed and nothing leaves.
    let c = a.send(&b.qp, b"while failed", a.lkey);
    assert_eq!(c.status, WcStatus::WrFlushErr);
    assert!(
        b.recv(1, wait).is_empty(),
        "nothing is sent from a QP in the error state"
    );
    // ...and every posted receive comes back flushed.
    let flushed = a.recv(RECVS as usize, wait);
    assert_eq!(flushed.len(), RECVS as usize, "{flushed:?}");
    assert!(
        flushed.iter().all(|c| c.status == WcStatus::WrFlushErr),
        "{flushed:?}"
    );

    a.qp.recover().unwrap();
    assert_eq!(a.qp.attr().qpn, qpn, "recovery keeps the QPN");
    a.post_recvs();
    let c = a.send(&b.qp, b"after recovery", a.lkey);
    assert_eq!(c.status, WcStatus::Success);
    let got = b.recv(1, wait);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, WcStatus::Success);
    assert_eq!(got[0].src_qp, qpn);
    let c = b.send(&a.qp, b"reply", b.lkey);
    assert_eq!(c.status, WcStatus::Success);
    let got = a.recv(1, wait);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, WcStatus::Success);
    assert_eq!(got[0].byte_len as usize, GRH_LEN + 5);
}

/// Delivery: a SEND with immediate and a plain SEND from `a` arrive at `b` with
/// the GRH area holding `a`'s GID, `byte_len` = 40 + payload, the source QPN,
/// and the immediate data exactly as sent (IBA 11.4.2.1 work completion fields;
/// RoCEv2 Annex A17.4.5.1 GRH placement).
pub fn delivery_semantics<Q: UdQueuePair>(a: Q, b: Q, wait: Duration) {
    let (mut a, mut b) = (Side::new(a), Side::new(b));
    b.post_recvs();
    for (payload, imm) in [
        (&b"with immediate"[..], Some(0x0001_2345)),
        (b"plain", None),
    ] {
        let c = a.send_imm(&b.qp, payload, a.lkey, imm);
        assert_eq!(c.status, WcStatus::Success);
        let got = b.recv(1, wait);
        assert_eq!(got.len(), 1, "{got:?}");
        let r = got[0];
        assert_eq!(r.status, WcStatus::Success, "{r:?}");
        assert_eq!(r.byte_len as usize, GRH_LEN + payload.len(), "{r:?}");
        assert_eq!(r.src_qp, a.qp.attr().qpn, "{r:?}");
        assert_eq!(r.imm, imm, "{r:?}");
        let slot = r.wr_id as usize * SLOT as usize;
        let buf = b.mem.region(b.region).unwrap().slice(slot, SLOT as usize);
        let buf = buf.expect("a completed receive is the caller's again");
        let grh = Grh::parse(&buf[..GRH_LEN], GrhLayout::for_gid(b.qp.attr().gid))
            .expect("the GRH area parses");
        assert_eq!(grh.sgid, a.qp.attr().gid);
        assert_eq!(&buf[GRH_LEN..GRH_LEN + payload.len()], payload);
    }
}

/// An oversized send (active MTU + 1) completes successfully and never arrives:
/// hardware drops it silently, which is why the socket refuses such sends itself.
pub fn oversize_send_completes_and_never_arrives<Q: UdQueuePair>(a: Q, b: Q, wait: Duration) {
    let (mut a, mut b) = (Side::new(a), Side::new(b));
    b.post_recvs();
    let mtu = a.qp.attr().active_mtu.bytes();
    assert!(mtu < SLOT as usize, "the send slot holds MTU + 1");
    let c = a.send(&b.qp, &vec![7u8; mtu + 1], a.lkey);
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    assert!(
        b.recv(1, wait).is_empty(),
        "an oversized send never arrives"
    );
    // The path still works.
    let c = a.send(&b.qp, &vec![8u8; mtu], a.lkey);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(b.recv(1, wait).len(), 1);
}

/// Selective signaling: of `RECVS` sends only the last is signaled; it is the
/// one completion, and it retires the earlier ones (completions are in order,
/// IBA 10.8.3); every send arrives, in order.
pub fn one_signaled_send_retires_the_earlier_ones<Q: UdQueuePair>(a: Q, b: Q, wait: Duration) {
    let (mut a, mut b) = (Side::new(a), Side::new(b));
    b.post_recvs();
    let ah = a.qp.create_ah(&AhAttr::new(b.qp.attr().gid, 0)).unwrap();
    let off = RECVS * SLOT;
    a.mem
        .region_mut(a.region)
        .unwrap()
        .slice_mut(off as usize, 64)
        .unwrap()
        .copy_from_slice(&[3u8; 64]);
    let wrs: Vec<SendWr> = (0..RECVS)
        .map(|i| SendWr {
            wr_id: 100 + u64::from(i),
            sge: Sge {
                region: a.region,
                offset: off,
                len: 64 + i,
                lkey: a.lkey,
            },
            ah,
            remote_qpn: b.qp.attr().qpn,
            remote_qkey: b.qp.attr().qkey,
            imm: Some(i),
            flags: SendFlags {
                signaled: i + 1 == RECVS,
                inline: false,
            },
        })
        .collect();
    a.qp.post_send(&a.mem, &wrs).unwrap();
    let mut c = [Completion::send(0); 8];
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        let n = a.qp.poll_send_cq(&mut c);
        got.extend_from_slice(&c[..n]);
    }
    // Give a late (wrong) extra completion the time to show up.
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
    let n = a.qp.poll_send_cq(&mut c);
    got.extend_from_slice(&c[..n]);
    assert_eq!(
        got.len(),
        1,
        "one completion for one signaled send: {got:?}"
    );
    assert_eq!(got[0].wr_id, 100 + u64::from(RECVS - 1));
    assert_eq!(got[0].status, WcStatus::Success);
    let arrived = b.recv(RECVS as usize, wait);
    let imms: Vec<Option<u32>> = arrived.iter().map(|r| r.imm).collect();
    assert_eq!(
        imms,
        (0..RECVS).map(Some).collect::<Vec<_>>(),
        "all arrive, in order"
    );
    // No WR references the AH any more: it may go.
    a.qp.destroy_ah(ah).unwrap();
}
