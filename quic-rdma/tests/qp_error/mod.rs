//! The error state of a UD queue pair, held by every provider the same way
//! (IBA 10.8.3: a work request completing in error moves the QP to the error
//! state, where every later WR is flushed; IBA 10.3.1: Error → Reset → Init →
//! RTR → RTS brings it back). Shared by the `sim` and `soft` test binaries.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use quic_rdma::fabric::{
    AhAttr, Completion, Memory, RecvWr, Region, SendFlags, SendWr, Sge, UdQueuePair, WcStatus,
    GRH_LEN,
};

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
        self.qp.post_recv(&self.mem, &wrs).unwrap();
    }

    /// Post one signaled send of `payload` to `to` with `lkey`; its completion.
    fn send(&mut self, to: &Q, payload: &[u8], lkey: u32) -> Completion {
        let off = RECVS * SLOT;
        self.mem.region_mut(self.region).unwrap().bytes_mut()
            [off as usize..off as usize + payload.len()]
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
            imm: None,
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

    /// Receive completions polled within `wait` (stops early at `n`).
    fn recv(&mut self, n: usize, wait: Duration) -> Vec<Completion> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        let mut c = [Completion::send(0); 16];
        while got.len() < n && Instant::now() < deadline {
            let k = self.qp.poll_recv_cq(&mut self.mem, &mut c);
            got.extend_from_slice(&c[..k]);
            if k == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        got
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
