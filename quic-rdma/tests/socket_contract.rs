//! The socket's send contract and address-handle keying (issue 9, defects 3 and 6),
//! over `sim` with a queue-pair wrapper that can withhold completions and break
//! part way through a post.

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::fabric::{
    AhAttr, AhId, AsyncEvent, Completion, FabricError, Gid, Memory, ProviderDrops, QpAttr, RecvWr,
    Region, SendWr, UdAddr, UdQueuePair, WcOpcode, WcStatus,
};
use quic_rdma::socket::{SocketConfig, SocketError, TxBuf, TxSendError, UdSocket};

fn g6(n: u16) -> Gid {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0x91, n).into()
}

/// A sim queue pair whose send completions can be withheld (so the send queue
/// fills) and whose `post_send` can fail after taking a number of WRs (a queue
/// pair that breaks mid-post).
struct Flaky {
    qp: SimQp,
    attr: QpAttr,
    ctl: Arc<Ctl>,
}

/// The test's controls of a [`Flaky`] (the socket owns the queue pair).
struct Ctl {
    /// Receive completions returned before the real ones (a buggy provider).
    inject: std::sync::Mutex<Vec<Completion>>,
    withhold_completions: AtomicBool,
    /// `post_send` takes this many WRs, then fails (`usize::MAX`: never).
    fail_after: AtomicUsize,
}

impl Flaky {
    fn new(qp: SimQp, max_send_wr: u32) -> (Self, Arc<Ctl>) {
        let attr = QpAttr {
            max_send_wr,
            ..qp.attr().clone()
        };
        let ctl = Arc::new(Ctl {
            inject: std::sync::Mutex::new(Vec::new()),
            withhold_completions: AtomicBool::new(true),
            fail_after: AtomicUsize::new(usize::MAX),
        });
        (
            Flaky {
                qp,
                attr,
                ctl: ctl.clone(),
            },
            ctl,
        )
    }
}

impl UdQueuePair for Flaky {
    fn attr(&self) -> &QpAttr {
        &self.attr
    }
    fn register(&mut self, region: &mut Region) -> Result<(), FabricError> {
        self.qp.register(region)
    }
    fn deregister(&mut self, region: &mut Region) -> Result<(), FabricError> {
        self.qp.deregister(region)
    }
    fn create_ah(&mut self, attr: &AhAttr) -> Result<AhId, FabricError> {
        self.qp.create_ah(attr)
    }
    fn destroy_ah(&mut self, ah: AhId) -> Result<(), FabricError> {
        self.qp.destroy_ah(ah)
    }
    fn post_send(&mut self, mem: &Memory, wrs: &[SendWr]) -> Result<(), (usize, FabricError)> {
        let k = self.ctl.fail_after.load(Ordering::Relaxed);
        if k < wrs.len() {
            self.qp.post_send(mem, &wrs[..k])?;
            return Err((k, FabricError::QpError("broken by the test".into())));
        }
        self.qp.post_send(mem, wrs)
    }
    fn post_recv(&mut self, mem: &mut Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        self.qp.post_recv(mem, wrs)
    }
    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize {
        if self.ctl.withhold_completions.load(Ordering::Relaxed) {
            0
        } else {
            self.qp.poll_send_cq(out)
        }
    }
    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [Completion]) -> usize {
        let mut inject = self.ctl.inject.lock().unwrap();
        if !inject.is_empty() {
            let n = inject.len().min(out.len());
            out[..n].copy_from_slice(&inject[..n]);
            inject.drain(..n);
            return n;
        }
        self.qp.poll_recv_cq(mem, out)
    }
    fn arm(&mut self, waker: &Waker) -> bool {
        self.qp.arm(waker)
    }
    fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.qp.poll_event()
    }
    fn recover(&mut self) -> Result<(), FabricError> {
        self.qp.recover()
    }
    fn drops(&self) -> ProviderDrops {
        self.qp.drops()
    }
}

fn setup(max_send_wr: u32) -> (SimFabric, UdSocket<Flaky>, UdSocket<SimQp>, Arc<Ctl>) {
    let f = SimFabric::new(SimConfig::default());
    let a = f.create_qp(g6(1), SimQpOptions::default()).unwrap();
    let b = f.create_qp(g6(2), SimQpOptions::default()).unwrap();
    let cfg = SocketConfig {
        signal_every: 1 << 20,
        ..SocketConfig::default()
    };
    let (a, ctl) = Flaky::new(a, max_send_wr);
    let a = UdSocket::new(a, cfg).unwrap();
    let b = UdSocket::new(b, SocketConfig::default()).unwrap();
    (f, a, b, ctl)
}

fn received(f: &SimFabric, b: &mut UdSocket<SimQp>) -> usize {
    f.settle(std::time::Duration::from_secs(2));
    let mut n = 0;
    while b.recv(usize::MAX, |_| n += 1) > 0 {}
    n
}

const SEG: usize = 2000;

/// Before: a transmit of more than one batch (64 WRs) posted its first batch,
/// then found no room for the second and returned `WouldBlock` — and the caller
/// sent the whole transmit again, duplicating the first 64 packets.
#[test]
fn a_send_that_does_not_fit_posts_nothing() {
    let (f, mut a, mut b, ctl) = setup(128);
    let dest = b.local_addr();
    for i in 0..40u8 {
        a.send(dest, 0, &[i; SEG], None).unwrap();
    }
    let before = a.stats();
    assert_eq!(a.sends_in_flight(), 40, "completions are withheld");
    // 100 segments: the first batch of 64 fits in the 88 free entries, all 100 do not.
    let big = vec![7u8; 100 * SEG];
    match a.send(dest, 0, &big, Some(SEG)) {
        Err(SocketError::WouldBlock) => {}
        other => panic!("expected WouldBlock, got {other:?}"),
    }
    let after = a.stats();
    assert_eq!(after.sent_wrs, before.sent_wrs, "nothing posted");
    assert_eq!(a.sends_in_flight(), 40);
    assert_eq!(received(&f, &mut b), 40);
    // Once completions come back the same send goes out whole, exactly once.
    ctl.withhold_completions.store(false, Ordering::Relaxed);
    a.send(dest, 0, &big, Some(SEG)).unwrap();
    assert_eq!(received(&f, &mut b), 100);
    assert_eq!(a.stats().sent_wrs, before.sent_wrs + 100);
}

#[test]
fn a_send_larger_than_the_queue_is_refused_with_the_fix() {
    let (_f, mut a, b, _ctl) = setup(32);
    let e = a
        .send(b.local_addr(), 0, &vec![1u8; 40 * SEG], Some(SEG))
        .unwrap_err();
    assert!(
        matches!(
            e,
            SocketError::TooManySegments {
                segments: 40,
                max: 32
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("send fewer"), "{e}");
    assert_eq!(a.max_segments(), 32);
    assert_eq!(a.stats().sent_wrs, 0);
}

#[test]
fn a_post_broken_part_way_reports_what_went_out() {
    let (f, mut a, mut b, ctl) = setup(256);
    ctl.fail_after.store(3, Ordering::Relaxed);
    let e = a
        .send(b.local_addr(), 0, &vec![3u8; 10 * SEG], Some(SEG))
        .unwrap_err();
    assert!(
        matches!(
            e,
            SocketError::PartiallyPosted {
                posted: 3,
                segments: 10,
                ..
            }
        ),
        "{e:?}"
    );
    let s = a.stats();
    assert_eq!(
        (s.sent_wrs, s.partial_posts, s.unposted_segments),
        (3, 1, 7)
    );
    assert_eq!(a.sends_in_flight(), 3, "the unposted WRs' slots came back");
    assert_eq!(received(&f, &mut b), 3);
}

/// Before: the AH cache tracked "where was (QPN, Q_Key) last seen", so two
/// peers on different hosts with the same QPN rebuilt AHs on every alternation.
#[test]
fn peers_with_one_qpn_on_two_gids_do_not_rebuild_address_handles() {
    let f = SimFabric::new(SimConfig::default());
    let mut a = UdSocket::new(
        f.create_qp(g6(1), SimQpOptions::default()).unwrap(),
        SocketConfig::default(),
    )
    .unwrap();
    let qpn = 0x11;
    let (p, q) = (UdAddr::new(g6(5), qpn, 7), UdAddr::new(g6(6), qpn, 7));
    for i in 0..100u8 {
        let to = if i % 2 == 0 { p } else { q };
        a.send(to, 0, &[0x40, 0x11, 0x22, 0x33, i], None).unwrap();
    }
    let s = a.stats();
    assert_eq!((s.ah_created, s.ah_rebuilt, s.ah_hits), (2, 0, 98), "{s:?}");
    assert_eq!(a.ah_counts(), (2, 0));
}

/// Before: every new (QPN, Q_Key) added a map entry that was never removed.
/// Now everything per destination is bounded by the AH capacity.
#[test]
fn many_destinations_keep_the_cache_bounded() {
    let f = SimFabric::new(SimConfig::default());
    let cfg = SocketConfig {
        ah_capacity: 8,
        ..SocketConfig::default()
    };
    let mut a = UdSocket::new(f.create_qp(g6(1), SimQpOptions::default()).unwrap(), cfg).unwrap();
    for i in 0..5000u32 {
        let to = UdAddr::new(g6(100 + (i % 64) as u16), 0x100 + i, 7);
        a.send(to, 0, &[0x40, 0x11, 0x22, 0x33], None).unwrap();
        a.reap_sends();
    }
    let (live, retired) = a.ah_counts();
    assert!(live <= 8, "{live}");
    assert!(retired <= a.sends_in_flight(), "{retired}");
}

/// Found by the `socket_recv` fuzz target: with a receive queue of depth 1 and
/// a repost batch above 1, the only receive was never reposted (the low-water
/// test was `posted < depth / 2`, i.e. `0 < 0`), and the socket went deaf.
#[test]
fn a_one_deep_receive_queue_keeps_receiving() {
    let f = SimFabric::new(SimConfig::default());
    let mut a = UdSocket::new(
        f.create_qp(g6(1), SimQpOptions::default()).unwrap(),
        SocketConfig::default(),
    )
    .unwrap();
    let tiny = SocketConfig {
        recv_depth: 1,
        repost_batch: 4,
        ..SocketConfig::default()
    };
    let mut b = UdSocket::new(f.create_qp(g6(2), SimQpOptions::default()).unwrap(), tiny).unwrap();
    for i in 0..5u8 {
        a.send(b.local_addr(), 0, &[i; 100], None).unwrap();
        assert_eq!(received(&f, &mut b), 1, "datagram {i}");
    }
    assert_eq!(b.stats().provider.no_recv_posted, 0);
}

/// Found by the `socket_recv` fuzz target: completions for wr_ids the provider
/// never held (or twice for one), lengths outside the buffer and source QPNs
/// over 24 bits panicked (index out of range, counter underflow) or posted one
/// buffer twice. No conforming provider produces them; they are now dropped
/// and counted.
#[test]
fn bogus_receive_completions_are_dropped_and_counted() {
    let f = SimFabric::new(SimConfig::default());
    let (a, ctl) = Flaky::new(f.create_qp(g6(1), SimQpOptions::default()).unwrap(), 1024);
    let cfg = SocketConfig {
        recv_depth: 16,
        ..SocketConfig::default()
    };
    let mut a = UdSocket::new(a, cfg).unwrap();
    let mut b = UdSocket::new(
        f.create_qp(g6(2), SimQpOptions::default()).unwrap(),
        SocketConfig::default(),
    )
    .unwrap();
    let wc = |wr_id, byte_len, src_qp| Completion {
        wr_id,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        byte_len,
        imm: None,
        src_qp,
        timestamp: None,
    };
    // Slot 0 is posted (the socket posts every slot); slot 3 is too.
    *ctl.inject.lock().unwrap() = vec![
        wc(16_789_419_410_837_209_141, 100, 1), // not a slot at all
        wc(2560, 100, 1),                       // past the pool
        wc(0, 2, 1),                            // shorter than the GRH area
        wc(0, 100, 1),                          // slot 0 again: already returned
        wc(3, 1 << 20, 1),                      // longer than the buffer
        wc(4, 100, 1 << 24),                    // a 25-bit source QPN
    ];
    let mut got = 0;
    a.recv(usize::MAX, |_| got += 1);
    assert_eq!(got, 0);
    assert_eq!(a.stats().recv_bogus_completions, 6);
    // Still receiving. The three fake completions named slots the provider
    // really holds (0, 3, 4), so the socket took them back early: the real
    // completions of those slots are bogus to it now, and dropped. Nothing
    // else is lost, and nothing panics.
    let mut data = Vec::new();
    for i in 0..20u8 {
        b.send(a.local_addr(), 0, &[i; 300], None).unwrap();
        f.settle(std::time::Duration::from_secs(2));
        while a.recv(usize::MAX, |r| data.push(r.data[0])) > 0 {}
    }
    let bogus = a.stats().recv_bogus_completions - 6;
    assert!(bogus <= 3, "{bogus}");
    assert_eq!(data.len() as u64 + bogus, 20);
}

// Zero-copy transmit buffers (`take_tx_buf` / `send_tx_buf`): their lifecycle.

fn setup_with(
    max_send_wr: u32,
    cfg: SocketConfig,
) -> (SimFabric, UdSocket<Flaky>, UdSocket<SimQp>, Arc<Ctl>) {
    let f = SimFabric::new(SimConfig::default());
    let a = f.create_qp(g6(1), SimQpOptions::default()).unwrap();
    let b = f.create_qp(g6(2), SimQpOptions::default()).unwrap();
    let (a, ctl) = Flaky::new(a, max_send_wr);
    let a = UdSocket::new(a, cfg).unwrap();
    let b = UdSocket::new(b, SocketConfig::default()).unwrap();
    (f, a, b, ctl)
}

/// Every datagram `b` received, in order.
fn payloads(f: &SimFabric, b: &mut UdSocket<SimQp>) -> Vec<Vec<u8>> {
    f.settle(std::time::Duration::from_secs(2));
    let mut v = Vec::new();
    while b.recv(usize::MAX, |r| v.push(r.data.to_vec())) > 0 {}
    v
}

/// `n` segments of `SEG` bytes, each byte telling its segment and position.
fn pattern(n: usize, tag: u8) -> Vec<u8> {
    (0..n * SEG)
        .map(|i| tag ^ (i / SEG) as u8 ^ (i % 251) as u8)
        .collect()
}

/// Take a buffer and write `data` into it, as quinn-proto's `poll_transmit` does.
fn filled<Q: UdQueuePair>(a: &mut UdSocket<Q>, data: &[u8]) -> TxBuf {
    let buf = a.take_tx_buf().expect("a free transmit buffer");
    assert!(a.tx_bytes(&buf).is_empty(), "lent empty");
    a.tx_vec(&buf).extend_from_slice(data);
    buf
}

/// Selective signaling: a completion retires every earlier WR, so a buffer is
/// free only once the completion covering its *last* WR is reaped — not when
/// a completion lands on one of its earlier WRs.
#[test]
fn a_tx_buffer_returns_only_with_the_completion_covering_its_last_wr() {
    let cfg = SocketConfig {
        signal_every: 4,
        tx_bufs: 64,
        ..SocketConfig::default()
    };
    let (f, mut a, mut b, ctl) = setup_with(256, cfg);
    ctl.withhold_completions.store(false, Ordering::Relaxed);
    let dest = b.local_addr();
    // WRs 0 and 1: copied, unsignaled.
    for i in 0..2u8 {
        a.send(dest, 0, &[i; SEG], None).unwrap();
    }
    // WRs 2, 3 (the 4th: signaled) and 4: from a transmit buffer.
    let data = pattern(3, 0x5A);
    let buf = filled(&mut a, &data);
    // A full batch, and room for the ACK frame quinn-proto writes and takes back.
    assert_eq!(
        a.tx_buf_capacity(),
        a.max_segments() * a.mtu() + quic_rdma::socket::TX_BUF_OVERRUN
    );
    assert_eq!(a.tx_vec(&buf).capacity(), a.tx_buf_capacity());
    assert_eq!(a.tx_buf_counts(), (1, 0));
    a.send_tx_buf(buf, dest, 0, None, data.len(), Some(SEG))
        .unwrap();
    a.reap_sends();
    assert_eq!(a.stats().send_completions, 1);
    assert_eq!(
        a.tx_buf_counts(),
        (0, 1),
        "WR 3's completion covers WR 2, not WR 4: the buffer is still in flight"
    );
    assert_eq!(a.sends_in_flight(), 1);
    // WRs 5, 6 and 7 (signaled): its completion covers WR 4.
    for i in 5..8u8 {
        a.send(dest, 0, &[i; SEG], None).unwrap();
    }
    a.reap_sends();
    assert_eq!(a.tx_buf_counts(), (0, 0), "back in the pool");
    let s = a.stats();
    assert_eq!((s.tx_buf_sends, s.tx_bufs_created, s.sent_wrs), (1, 1, 8));
    let got = payloads(&f, &mut b);
    assert_eq!(got.len(), 8);
    assert_eq!(got[2..5].concat(), data, "the WRs carried what was written");
    // The same buffer is lent again, empty: nothing new is registered.
    let again = a.take_tx_buf().unwrap();
    assert!(a.tx_bytes(&again).is_empty());
    a.return_tx_buf(again);
    assert_eq!(a.stats().tx_bufs_created, 1);
}

/// With fewer buffers than `signal_every`, each send from one is signaled (or
/// the pool could run dry with no completion ever coming); an empty pool is
/// reported, and refilled once completions are reaped.
#[test]
fn a_short_tx_pool_signals_and_refills_on_completions() {
    let cfg = SocketConfig {
        signal_every: 16,
        tx_bufs: 2,
        ..SocketConfig::default()
    };
    let (f, mut a, mut b, ctl) = setup_with(256, cfg);
    let dest = b.local_addr();
    for tag in 0..2u8 {
        let buf = filled(&mut a, &pattern(1, tag));
        a.send_tx_buf(buf, dest, 0, None, SEG, None).unwrap();
    }
    assert_eq!(a.stats().signaled_sends, 2);
    assert!(
        a.take_tx_buf().is_none(),
        "both in flight, completions withheld"
    );
    assert_eq!(a.stats().tx_bufs_exhausted, 1);
    assert_eq!(a.tx_buf_counts(), (0, 2));
    ctl.withhold_completions.store(false, Ordering::Relaxed);
    let buf = a.take_tx_buf().expect("reaped and lent again");
    assert_eq!(a.tx_buf_counts(), (1, 0));
    a.return_tx_buf(buf);
    assert_eq!(a.stats().tx_bufs_created, 2);
    assert_eq!(payloads(&f, &mut b), vec![pattern(1, 0), pattern(1, 1)]);
}

/// A send the queue cannot take posts nothing and hands the buffer back with
/// its bytes; the retry sends them, exactly once.
#[test]
fn a_refused_tx_send_keeps_its_bytes_for_the_retry() {
    let (f, mut a, mut b, ctl) = setup(8);
    let dest = b.local_addr();
    for i in 0..8u8 {
        a.send(dest, 0, &[i; SEG], None).unwrap();
    }
    let data = pattern(3, 7);
    let buf = filled(&mut a, &data);
    let before = a.stats().sent_wrs;
    let buf = match a.send_tx_buf(buf, dest, 0, None, data.len(), Some(SEG)) {
        Err(TxSendError::WouldBlock(buf)) => buf,
        other => panic!("expected WouldBlock, got {other:?}"),
    };
    assert_eq!(a.stats().sent_wrs, before, "nothing posted");
    assert_eq!(a.tx_bytes(&buf), &data[..], "the bytes wait in the buffer");
    assert_eq!(a.tx_buf_counts(), (1, 0), "still the caller's");
    ctl.withhold_completions.store(false, Ordering::Relaxed);
    a.send_tx_buf(buf, dest, 0, None, data.len(), Some(SEG))
        .unwrap();
    let got = payloads(&f, &mut b);
    assert_eq!(got.len(), 11);
    assert_eq!(got[8..].concat(), data);
    assert_eq!(a.stats().tx_buf_sends, 1);
}

/// A buffer whose `Vec` reallocated while lent has lost its registered
/// memory: it is never posted from. The transmit goes by copy, the buffer gets
/// fresh registered memory, and the event is counted.
#[test]
fn a_reallocated_tx_buffer_is_never_posted_from() {
    let (f, mut a, mut b, ctl) = setup(256);
    ctl.withhold_completions.store(false, Ordering::Relaxed);
    let dest = b.local_addr();
    let buf = a.take_tx_buf().unwrap();
    let cap = a.tx_buf_capacity();
    let v = a.tx_vec(&buf);
    v.reserve(cap + 1); // what quinn-proto would do were the capacity short
                        // The allocator may move it or grow it in place (mremap): either way it
                        // is no longer the allocation that was registered.
    assert_ne!(v.capacity(), cap, "reallocated");
    let data = pattern(2, 9);
    v.extend_from_slice(&data);
    a.send_tx_buf(buf, dest, 0, None, data.len(), Some(SEG))
        .unwrap();
    let s = a.stats();
    assert_eq!(s.tx_buf_reallocations, 1);
    assert_eq!(
        s.tx_buf_sends, 0,
        "not zero-copy: sent through the copying path"
    );
    assert_eq!((s.sent_wrs, s.send_errors), (2, 0));
    assert_eq!(a.tx_buf_counts(), (0, 0), "the copy holds no buffer");
    assert_eq!(payloads(&f, &mut b).concat(), data);
    // The same buffer, with fresh registered memory, sends zero-copy again.
    let data = pattern(2, 10);
    let buf = filled(&mut a, &data);
    assert_eq!(a.tx_vec(&buf).capacity(), cap);
    a.send_tx_buf(buf, dest, 0, None, data.len(), Some(SEG))
        .unwrap();
    let s = a.stats();
    assert_eq!(
        (s.tx_buf_sends, s.tx_bufs_created, s.send_errors),
        (1, 1, 0)
    );
    assert_eq!(payloads(&f, &mut b).concat(), data);
}

/// A reallocated buffer refused for lack of room keeps the bytes (now in
/// fresh registered memory) for the retry, which then goes zero-copy.
#[test]
fn a_reallocated_and_refused_tx_send_keeps_its_bytes() {
    let (f, mut a, mut b, ctl) = setup(8);
    let dest = b.local_addr();
    for i in 0..8u8 {
        a.send(dest, 0, &[i; SEG], None).unwrap();
    }
    let buf = a.take_tx_buf().unwrap();
    let cap = a.tx_buf_capacity();
    let data = pattern(2, 3);
    let v = a.tx_vec(&buf);
    v.reserve(cap * 2);
    v.extend_from_slice(&data);
    let buf = match a.send_tx_buf(buf, dest, 0, None, data.len(), Some(SEG)) {
        Err(TxSendError::WouldBlock(buf)) => buf,
        other => panic!("expected WouldBlock, got {other:?}"),
    };
    assert_eq!(a.tx_bytes(&buf), &data[..]);
    assert_eq!(
        a.tx_vec(&buf).capacity(),
        cap,
        "fresh memory, the usual size"
    );
    ctl.withhold_completions.store(false, Ordering::Relaxed);
    a.send_tx_buf(buf, dest, 0, None, data.len(), Some(SEG))
        .unwrap();
    let s = a.stats();
    assert_eq!((s.tx_buf_reallocations, s.tx_buf_sends), (1, 1));
    let got = payloads(&f, &mut b);
    assert_eq!(got[8..].concat(), data);
}

/// A post the provider broke part way leaves WRs pointing into the buffer:
/// it stays in flight until a completion covers them.
#[test]
fn a_partially_posted_tx_buffer_waits_for_its_posted_wrs() {
    let (f, mut a, mut b, ctl) = setup(256);
    ctl.withhold_completions.store(false, Ordering::Relaxed);
    ctl.fail_after.store(3, Ordering::Relaxed);
    let dest = b.local_addr();
    let data = pattern(10, 1);
    let buf = filled(&mut a, &data);
    match a.send_tx_buf(buf, dest, 0, None, data.len(), Some(SEG)) {
        Err(TxSendError::Failed(SocketError::PartiallyPosted { posted: 3, .. })) => {}
        other => panic!("expected PartiallyPosted, got {other:?}"),
    }
    a.reap_sends();
    assert_eq!(a.tx_buf_counts(), (0, 1), "3 unsignaled WRs point into it");
    ctl.fail_after.store(usize::MAX, Ordering::Relaxed);
    a.send(dest, 0, &[0; SEG], None).unwrap(); // signaled: the queue is quiet
    a.reap_sends();
    assert_eq!(a.tx_buf_counts(), (0, 0));
    assert_eq!(payloads(&f, &mut b)[..3].concat(), data[..3 * SEG]);
}

#[test]
#[should_panic(expected = "did not lend it")]
fn a_tx_buffer_is_refused_by_another_socket() {
    let (_f, mut a, mut b, _ctl) = setup(256);
    let buf = a.take_tx_buf().unwrap();
    b.return_tx_buf(buf);
}
