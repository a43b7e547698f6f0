//! The quinn adapter's wake-ups under a completion channel with `verbs`
//! semantics (issue 22), deterministic and without the rxe guest.
//!
//! `verbs` wakes a sleeper through a completion channel: an event is raised
//! only for a completion that arrives after the CQ was armed
//! (`ibv_req_notify_cq`); arming first consumes the channel's pending events
//! (`ibv_get_cq_event`) and then looks for completions that arrived before
//! (it polls them ahead into a stash, so they raise no event later); the
//! runtime's reactor learns of an event only when it next looks at the
//! descriptor. quinn has several tasks on one socket — the endpoint task
//! receiving, one writer per connection waiting for send room — and any of
//! them may arm. [`Channel`] wraps a `sim` queue pair with exactly these
//! rules (the reactor's look is [`Ctl::reactor_turn`], taken when the test
//! says), and sends whose completions can be held back (a full send queue).
//!
//! Races found by reading the code, each a test here that failed before:
//! 1. a writer that arms while receive completions wait spun in
//!    `poll_writable` (arm said "work waiting", the work was not its own),
//!    holding the socket's lock so the receiver could not run;
//! 2. that arm consumed the channel event that would have woken the sleeping
//!    receive task, so the packet waited unread until something else came;
//! 3. `poll_writable` reported room for one datagram while quinn's transmits
//!    carry up to 10 segments, posted whole or not at all: `try_send` then
//!    said `WouldBlock` and quinn went straight back to `poll_writable`, a
//!    spin until a completion came.

use std::io::IoSliceMut;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::fabric::{
    AhAttr, AhId, AsyncEvent, Completion, FabricError, Gid, Memory, ProviderDrops, QpAttr, RecvWr,
    Region, SendWr, UdQueuePair,
};
use quic_rdma::quinn_adapter::RdmaUdpSocket;
use quic_rdma::socket::{SocketConfig, UdSocket};
use quinn::udp::{RecvMeta, Transmit};
use quinn::AsyncUdpSocket;

fn g6(n: u16) -> Gid {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0x22, n).into()
}

/// A `sim` queue pair behind a completion channel with `verbs` semantics.
struct Channel {
    qp: SimQp,
    attr: QpAttr,
    ctl: Arc<Ctl>,
    /// Send completions polled from the CQ but held back (`Ctl::hold_sends`).
    held: Vec<Completion>,
}

/// The test's side of a [`Channel`].
#[derive(Default)]
struct Ctl {
    /// Hold send completions back: the send queue stays full.
    hold_sends: AtomicBool,
    state: Mutex<ChannelState>,
}

#[derive(Default)]
struct ChannelState {
    /// Events raised and not yet consumed by an arm or seen by the reactor.
    events: usize,
    /// What the reactor wakes when it sees an event (the waker of the last arm).
    target: Option<Waker>,
}

impl Ctl {
    /// The reactor looks at the descriptor: pending events wake the target.
    fn reactor_turn(&self) -> bool {
        let mut st = self.state.lock().unwrap();
        if st.events == 0 {
            return false;
        }
        st.events = 0;
        if let Some(w) = st.target.take() {
            w.wake();
        }
        true
    }
}

/// Raised by the `sim` queue pair on an arrival after the arm: one event.
struct EventRaiser(Arc<Ctl>);

impl Wake for EventRaiser {
    fn wake(self: Arc<Self>) {
        self.0.state.lock().unwrap().events += 1;
    }
}

impl Channel {
    fn absorb_sends(&mut self) {
        let mut buf = [Completion::send(0); 32];
        loop {
            let n = self.qp.poll_send_cq(&mut buf);
            self.held.extend_from_slice(&buf[..n]);
            if n < buf.len() {
                return;
            }
        }
    }
}

impl UdQueuePair for Channel {
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
        self.qp.post_send(mem, wrs)
    }
    fn post_recv(&mut self, mem: &mut Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        self.qp.post_recv(mem, wrs)
    }
    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize {
        self.absorb_sends();
        if self.ctl.hold_sends.load(Ordering::Relaxed) {
            return 0;
        }
        let n = self.held.len().min(out.len());
        out[..n].copy_from_slice(&self.held[..n]);
        self.held.drain(..n);
        n
    }
    fn poll_recv_cq(&mut self, mem: &mut Memory, out: &mut [Completion]) -> usize {
        self.qp.poll_recv_cq(mem, out)
    }
    fn arm(&mut self, waker: &Waker) -> bool {
        {
            // ibv_get_cq_event until none: the events are consumed, whoever
            // else was waiting for the reactor to see them.
            let mut st = self.ctl.state.lock().unwrap();
            st.events = 0;
            st.target = Some(waker.clone());
        }
        // ibv_req_notify_cq, then look for what arrived before it.
        self.absorb_sends();
        let raiser = Waker::from(Arc::new(EventRaiser(self.ctl.clone())));
        let recv_waiting = self.qp.arm(&raiser);
        recv_waiting || (!self.ctl.hold_sends.load(Ordering::Relaxed) && !self.held.is_empty())
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

/// Counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Count {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

struct Setup {
    fabric: SimFabric,
    sock: Arc<RdmaUdpSocket<Channel>>,
    ctl: Arc<Ctl>,
    peer: UdSocket<SimQp>,
}

/// Our adapter socket over a [`Channel`] with a send queue of `max_send_wr`,
/// and a plain `sim` peer.
fn setup(max_send_wr: u32) -> Setup {
    let fabric = SimFabric::new(SimConfig::default());
    let qp = fabric.create_qp(g6(1), SimQpOptions::default()).unwrap();
    let attr = QpAttr {
        max_send_wr,
        ..qp.attr().clone()
    };
    let ctl = Arc::new(Ctl::default());
    let chan = Channel {
        qp,
        attr,
        ctl: ctl.clone(),
        held: Vec::new(),
    };
    let sock = Arc::new(RdmaUdpSocket::new(
        UdSocket::new(chan, SocketConfig::default()).unwrap(),
    ));
    let peer = fabric.create_qp(g6(2), SimQpOptions::default()).unwrap();
    let peer = UdSocket::new(peer, SocketConfig::default()).unwrap();
    Setup {
        fabric,
        sock,
        ctl,
        peer,
    }
}

const SEG: usize = 1200;

/// Post single datagrams to the peer, completions held, until `free` send
/// entries are left.
fn fill_send_queue(s: &Setup, free: usize) {
    s.ctl.hold_sends.store(true, Ordering::Relaxed);
    let dest = s.peer.local_addr();
    let max = s.sock.with_socket(|u| u.qp_attr().max_send_wr as usize);
    for _ in 0..max - free {
        s.sock
            .with_socket(|u| u.send(dest, 0, &[9u8; SEG], None))
            .unwrap();
    }
    assert_eq!(s.sock.with_socket(|u| u.sends_in_flight()), max - free);
}

/// Poll `poll_recv` once with `w`; the number of datagrams it returned.
fn poll_recv_once(sock: &RdmaUdpSocket<Channel>, w: &Waker) -> Option<usize> {
    let mut storage = vec![0u8; 64 * 1024];
    let mut bufs = [IoSliceMut::new(&mut storage)];
    let mut meta = [RecvMeta::default()];
    match sock.poll_recv(&mut Context::from_waker(w), &mut bufs, &mut meta) {
        Poll::Ready(Ok(n)) => Some(n),
        Poll::Ready(Err(e)) => panic!("poll_recv failed: {e}"),
        Poll::Pending => None,
    }
}

/// `poll_writable` on a thread of its own: its result, or `None` if it did
/// not return within 2 s (it spun).
fn poll_writable_bounded(sock: &Arc<RdmaUdpSocket<Channel>>, w: Waker) -> Option<Poll<()>> {
    let sock = sock.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut poller = sock.create_io_poller();
        let p = poller
            .as_mut()
            .poll_writable(&mut Context::from_waker(&w))
            .map(|r| r.unwrap());
        let _ = tx.send(p);
    });
    rx.recv_timeout(Duration::from_secs(2)).ok()
}

/// Races 1 and 2: a writer arms while a packet waits and the receiver sleeps.
#[test]
fn a_writer_arming_never_strands_the_sleeping_receiver() {
    let mut s = setup(16);
    // The receive task finds nothing and sleeps (armed).
    let receiver = Arc::new(Count::default());
    let rw = Waker::from(receiver.clone());
    assert_eq!(poll_recv_once(&s.sock, &rw), None);
    // The send queue is full: the writer will have to wait.
    fill_send_queue(&s, 0);
    // A packet arrives: the channel raises an event the reactor has not seen yet.
    let to = s.sock.ud_addr();
    s.peer.send(to, 0, &[1u8; SEG], None).unwrap();
    s.fabric.settle(Duration::from_secs(2));
    // The writer looks for room, finds none, and arms: that consumes the event.
    let writer = Arc::new(Count::default());
    let verdict = poll_writable_bounded(&s.sock, Waker::from(writer.clone()));
    assert_eq!(
        verdict,
        Some(Poll::Pending),
        "poll_writable must return Pending, not spin on the receive completions"
    );
    // The reactor's next look finds nothing left to report...
    s.ctl.reactor_turn();
    // ...so the receiver must have been woken by whoever consumed its event.
    assert!(
        receiver.get() >= 1,
        "the receive task sleeps with a packet waiting"
    );
    assert_eq!(
        poll_recv_once(&s.sock, &rw),
        Some(1),
        "and reads it when polled"
    );
    // Room comes back: the writer is woken and finds it.
    s.ctl.hold_sends.store(false, Ordering::Relaxed);
    s.sock.with_socket(|u| u.reap_sends());
    assert_eq!(
        poll_writable_bounded(&s.sock, Waker::from(writer.clone())),
        Some(Poll::Ready(()))
    );
}

/// Race 3: ready means the largest transmit quinn may hand over fits whole.
#[test]
fn writable_means_room_for_a_whole_transmit() {
    let s = setup(64);
    let segments = s.sock.max_transmit_segments().min(10);
    assert!(segments > 1, "the socket posts GSO-style transmits");
    // Room for fewer segments than a transmit may carry.
    fill_send_queue(&s, segments - 1);
    let w = Waker::from(Arc::new(Count::default()));
    assert_eq!(
        poll_writable_bounded(&s.sock, w.clone()),
        Some(Poll::Pending),
        "room for {} datagrams is not room for a {segments}-segment transmit",
        segments - 1
    );
    // Completions return: ready, and a transmit of that many segments goes out.
    s.ctl.hold_sends.store(false, Ordering::Relaxed);
    assert_eq!(poll_writable_bounded(&s.sock, w), Some(Poll::Ready(())));
    let dest = s.sock.peer_addr(s.peer.local_addr());
    let payload = vec![5u8; segments * SEG];
    let t = Transmit {
        destination: dest,
        ecn: None,
        contents: &payload,
        segment_size: Some(SEG),
        src_ip: None,
    };
    s.sock
        .try_send(&t)
        .expect("a transmit sent after a ready goes out whole");
    let st = s.sock.stats();
    assert_eq!(st.would_block, 0, "{st:?}");
}
