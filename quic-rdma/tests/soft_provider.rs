//! The `soft` provider end to end over loopback: two ports on different IPs (so
//! different GIDs), payload/GRH/src_qp/imm checks, and every receive drop cause.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use quic_rdma::fabric::soft::codec::{self, IcrcContext, IpPair, UdHeader};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::{
    AhAttr, Completion, Gid, Grh, GrhLayout, Memory, Mtu, RecvWr, Region, SendFlags, SendWr, Sge,
    UdQueuePair, WcOpcode, WcStatus, DEFAULT_QKEY, GRH_LEN,
};

mod conformance;

const SLOT: u32 = 4096 + 64;

/// A QP with one registered region of `n` receive slots (+ one send slot at the end).
struct Ep {
    qp: SoftQp,
    mem: Memory,
    region: u32,
    lkey: u32,
    /// Traffic class of the AHs `send` creates.
    tc: u8,
}

impl Ep {
    fn new(port: &SoftPort, qkey: u32, slots: u32) -> Ep {
        let mut qp = port.create_qp(qkey).unwrap();
        let mut mem = Memory::new();
        let mut r = Region::new(((slots + 1) * SLOT) as usize);
        qp.register(&mut r).unwrap();
        let lkey = r.lkey().unwrap();
        let region = mem.push(r);
        Ep {
            qp,
            mem,
            region,
            lkey,
            tc: 0b10,
        }
    }

    fn sge(&self, slot: u32, len: u32) -> Sge {
        Sge {
            region: self.region,
            offset: slot * SLOT,
            len,
            lkey: self.lkey,
        }
    }

    fn post_recvs(&mut self, slots: std::ops::Range<u32>, len: u32) {
        let wrs: Vec<RecvWr> = slots
            .map(|i| RecvWr {
                wr_id: u64::from(i),
                sge: self.sge(i, len),
            })
            .collect();
        self.qp.post_recv(&mut self.mem, &wrs).unwrap();
    }

    /// Send `payload` from the last slot to (`gid`, `qpn`, `qkey`).
    fn send(&mut self, gid: Gid, qpn: u32, qkey: u32, payload: &[u8], imm: Option<u32>) {
        let slot = (self.mem.region(self.region).unwrap().len() as u32 / SLOT) - 1;
        let off = (slot * SLOT) as usize;
        self.mem
            .region_mut(self.region)
            .unwrap()
            .slice_mut(off, payload.len())
            .unwrap()
            .copy_from_slice(payload);
        let ah = self
            .qp
            .create_ah(&AhAttr {
                traffic_class: self.tc,
                ..AhAttr::new(gid, 0x1234)
            })
            .unwrap();
        let wr = SendWr {
            wr_id: 99,
            sge: self.sge(slot, payload.len() as u32),
            ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
            imm,
            flags: SendFlags {
                signaled: true,
                inline: false,
            },
        };
        self.qp.post_send(&self.mem, &[wr]).unwrap();
        let mut c = [Completion::send(0); 4];
        assert_eq!(self.qp.poll_send_cq(&mut c), 1);
        assert_eq!(c[0].status, WcStatus::Success);
        assert_eq!(c[0].wr_id, 99);
        self.qp.destroy_ah(ah).unwrap();
    }

    /// Poll until `n` receive completions arrived (or 2 s passed).
    fn recv(&mut self, n: usize) -> Vec<Completion> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
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

    /// Poll for a while to let stray packets be processed (and dropped).
    fn settle(&mut self) -> usize {
        let mut c = [Completion::send(0); 16];
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_millis(100);
        while Instant::now() < deadline {
            n += self.qp.poll_recv_cq(&mut self.mem, &mut c);
            std::thread::sleep(Duration::from_millis(1));
        }
        n
    }

    fn data(&self, slot: u32, len: usize) -> &[u8] {
        let off = (slot * SLOT) as usize;
        let r = self.mem.region(self.region).unwrap();
        r.slice(off, len)
            .expect("a completed receive is the caller's again")
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Two ports on distinct loopback IPs with ephemeral UDP ports pointed at each other.
fn pair(a: &str, b: &str) -> (SoftPort, SoftPort) {
    let pa = SoftPort::open(SoftConfig::new(ip(a)).with_port(0)).unwrap();
    let pb = SoftPort::open(SoftConfig::new(ip(b)).with_port(0)).unwrap();
    pa.set_peer_port(pb.gid(), pb.local_addr().port());
    pb.set_peer_port(pa.gid(), pa.local_addr().port());
    (pa, pb)
}

#[test]
fn send_and_receive_with_and_without_immediate() {
    // The default configuration: both ports on UDP 4791, distinct IPs.
    let pa = SoftPort::open(SoftConfig::new(ip("127.77.0.1"))).unwrap();
    let pb = SoftPort::open(SoftConfig::new(ip("127.77.0.2"))).unwrap();
    assert_eq!(pa.local_addr().port(), 4791);
    assert_ne!(pa.gid(), pb.gid());
    assert_eq!(pb.gid(), Gid::from(Ipv4Addr::new(127, 77, 0, 2)));
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 4);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 4);
    assert_eq!(b.qp.attr().active_mtu, Mtu::M4096);
    b.post_recvs(0..4, SLOT);
    let bqpn = b.qp.attr().qpn;

    a.send(pb.gid(), bqpn, DEFAULT_QKEY, b"hello", None);
    let big: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    a.send(pb.gid(), bqpn, DEFAULT_QKEY, &big, Some(0xC0FF_EE00));

    let c = b.recv(2);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(c[0].opcode, WcOpcode::Recv);
    assert_eq!(c[0].wr_id, 0);
    assert_eq!(c[0].byte_len as usize, GRH_LEN + 5);
    assert_eq!(c[0].imm, None);
    assert_eq!(c[0].src_qp, a.qp.attr().qpn);
    assert_eq!(&b.data(0, GRH_LEN + 5)[GRH_LEN..], b"hello");
    let grh = Grh::parse(b.data(0, GRH_LEN), GrhLayout::Ipv4).unwrap();
    assert_eq!(grh.sgid, pa.gid());
    assert_eq!(grh.dgid, pb.gid());
    // AhAttr::new asks for ECT(0); IP_RECVTOS reports it back.
    assert_eq!(grh.ecn(), 0b10);

    assert_eq!(c[1].byte_len as usize, GRH_LEN + 4096);
    assert_eq!(c[1].imm, Some(0xC0FF_EE00));
    assert_eq!(&b.data(1, GRH_LEN + 4096)[GRH_LEN..], &big[..]);
    assert_eq!(b.qp.drops(), Default::default());
    let s = pb.stats();
    assert_eq!((s.rx_delivered, s.rx_ipv4_id_solved), (2, 0));
}

#[test]
fn selective_signaling_retires_earlier_sends() {
    let (pa, pb) = pair("127.78.0.1", "127.78.0.2");
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 1);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 8);
    b.post_recvs(0..8, SLOT);
    let ah = a.qp.create_ah(&AhAttr::new(pb.gid(), 0)).unwrap();
    let mut wr = SendWr {
        wr_id: 0,
        sge: a.sge(1, 64),
        ah,
        remote_qpn: b.qp.attr().qpn,
        remote_qkey: DEFAULT_QKEY,
        imm: None,
        flags: SendFlags::default(),
    };
    let mut wrs = Vec::new();
    for i in 0..4 {
        wr.wr_id = i;
        wr.flags.signaled = i == 3;
        wr.flags.inline = i == 0;
        wrs.push(wr);
    }
    a.qp.post_send(&a.mem, &wrs).unwrap();
    assert_eq!(a.qp.sends_outstanding(), 4);
    assert!(matches!(
        a.qp.destroy_ah(ah),
        Err(quic_rdma::fabric::FabricError::AhBusy(_))
    ));
    let mut c = [Completion::send(0); 8];
    assert_eq!(a.qp.poll_send_cq(&mut c), 1);
    assert_eq!(c[0].wr_id, 3);
    assert_eq!(a.qp.sends_outstanding(), 0);
    a.qp.destroy_ah(ah).unwrap();
    assert_eq!(b.recv(4).len(), 4);
}

#[test]
fn qps_sharing_a_port_are_demultiplexed_by_qpn() {
    let (pa, pb) = pair("127.79.0.1", "127.79.0.2");
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 1);
    let mut b1 = Ep::new(&pb, DEFAULT_QKEY, 2);
    let mut b2 = Ep::new(&pb, 0x2222, 2);
    b1.post_recvs(0..2, SLOT);
    b2.post_recvs(0..2, SLOT);
    a.send(pb.gid(), b1.qp.attr().qpn, DEFAULT_QKEY, b"one", None);
    a.send(pb.gid(), b2.qp.attr().qpn, 0x2222, b"two", Some(2));
    // b2 polls first: it reads both datagrams and parks b1's for b1.
    let c2 = b2.recv(1);
    assert_eq!(c2.len(), 1);
    assert_eq!(c2[0].imm, Some(2));
    assert_eq!(&b2.data(0, GRH_LEN + 3)[GRH_LEN..], b"two");
    let c1 = b1.recv(1);
    assert_eq!(c1.len(), 1);
    assert_eq!(&b1.data(0, GRH_LEN + 3)[GRH_LEN..], b"one");
}

#[test]
fn every_drop_cause_is_counted() {
    let (pa, pb) = pair("127.80.0.1", "127.80.0.2");
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 1);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 4);
    let bqpn = b.qp.attr().qpn;

    // No receive posted.
    a.send(pb.gid(), bqpn, DEFAULT_QKEY, b"nobody home", None);
    b.settle();
    assert_eq!(b.qp.drops().no_recv_posted, 1);

    b.post_recvs(0..3, SLOT);
    // Wrong Q_Key.
    a.send(pb.gid(), bqpn, 0x0BAD_0BAD, b"x", None);
    // Unknown destination QPN.
    a.send(pb.gid(), 0x00AB_CDEF, DEFAULT_QKEY, b"x", None);
    // Wrong P_Key: a port in another partition.
    let mut cfg = SoftConfig::new(ip("127.80.0.3")).with_port(0);
    cfg.pkey = 0x8123;
    let pc = SoftPort::open(cfg).unwrap();
    pc.set_peer_port(pb.gid(), pb.local_addr().port());
    let mut c = Ep::new(&pc, DEFAULT_QKEY, 1);
    c.send(pb.gid(), bqpn, DEFAULT_QKEY, b"x", None);

    // Raw datagrams: truncated, and a bad ICRC.
    let raw = UdpSocket::bind("127.80.0.4:0").unwrap();
    let to = pb.local_addr();
    // A BTH and the start of a DETH: truncated RoCE (shorter is a runt).
    raw.send_to(
        &[0x64, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 0, 0x11, 0x01],
        to,
    )
    .unwrap();
    let mut pkt = [0u8; 64];
    let ctx = IcrcContext {
        ip: IpPair::V4 {
            src: Ipv4Addr::new(127, 80, 0, 4),
            dst: Ipv4Addr::new(127, 80, 0, 2),
        },
        src_port: raw.local_addr().unwrap().port(),
        dst_port: to.port(),
    };
    let hdr = UdHeader::send(0xFFFF, bqpn, 0, DEFAULT_QKEY, 0x42, None);
    let n = codec::encode(&hdr, b"corrupt me", &ctx, &mut pkt).unwrap();
    pkt[22] ^= 0x01; // a payload bit
    raw.send_to(&pkt[..n], to).unwrap();

    b.settle();
    let d = b.qp.drops();
    assert_eq!(d.bad_qkey, 1, "{d:?}");
    assert_eq!(d.unknown_qpn, 1, "{d:?}");
    assert_eq!(d.bad_pkey, 1, "{d:?}");
    assert_eq!((d.malformed, d.bad_icrc), (1, 1), "{d:?}");
    let s = pb.stats();
    assert_eq!((s.rx_decode_errors, s.rx_bad_icrc), (1, 1), "{s:?}");
    assert_eq!(s.rx_delivered, 0);

    // Too long for the posted buffer: the receive completes with LocLenErr.
    let mut small = Ep::new(&pb, 0x3333, 1);
    small.post_recvs(0..1, GRH_LEN as u32 + 4);
    a.send(
        pb.gid(),
        small.qp.attr().qpn,
        0x3333,
        b"more than four",
        None,
    );
    let c = small.recv(1);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::LocLenErr);
    assert_eq!(small.qp.drops().too_long, 1);
}

#[test]
fn oversize_send_completes_but_never_arrives() {
    let mut cfg = SoftConfig::new(ip("127.81.0.1")).with_port(0);
    cfg.mtu = Mtu::M1024;
    let pa = SoftPort::open(cfg).unwrap();
    let pb = SoftPort::open(SoftConfig::new(ip("127.81.0.2")).with_port(0)).unwrap();
    pa.set_peer_port(pb.gid(), pb.local_addr().port());
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 1);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 1);
    b.post_recvs(0..1, SLOT);
    a.send(pb.gid(), b.qp.attr().qpn, DEFAULT_QKEY, &[7u8; 1200], None);
    assert_eq!(a.qp.drops().oversize_sent, 1);
    assert_eq!(b.settle(), 0);
    assert_eq!(pa.stats().tx_packets, 0);
}

/// Kernel rxe puts a random IPv4 ID on the wire; the receiver solves for it.
#[test]
fn rxe_style_nonzero_ip_id_is_accepted() {
    let pb = SoftPort::open(SoftConfig::new(ip("127.82.0.2")).with_port(0)).unwrap();
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 1);
    b.post_recvs(0..1, SLOT);
    let raw = UdpSocket::bind("127.82.0.1:0").unwrap();
    let to = pb.local_addr();
    let ctx = IcrcContext {
        ip: IpPair::V4 {
            src: Ipv4Addr::new(127, 82, 0, 1),
            dst: Ipv4Addr::new(127, 82, 0, 2),
        },
        src_port: raw.local_addr().unwrap().port(),
        dst_port: to.port(),
    };
    let hdr = UdHeader::send(0xFFFF, b.qp.attr().qpn, 5, DEFAULT_QKEY, 0x77, Some(1));
    let mut pkt = [0u8; 64];
    let n = codec::encode(&hdr, b"from rxe", &ctx, &mut pkt).unwrap();
    // Re-stamp the ICRC as if the IP header had carried ID 0x1d2c.
    let crc = codec::icrc(&ctx, 0x1d2c, &pkt[..n - 4]);
    pkt[n - 4..n].copy_from_slice(&crc.to_le_bytes());
    raw.send_to(&pkt[..n], to).unwrap();
    let c = b.recv(1);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].src_qp, 0x77);
    assert_eq!(&b.data(0, GRH_LEN + 8)[GRH_LEN..], b"from rxe");
    assert_eq!(pb.stats().rx_ipv4_id_solved, 1);
}

#[test]
fn ipv6_ports() {
    let Ok(pa) = SoftPort::open(SoftConfig::new(ip("::1")).with_port(0)) else {
        eprintln!("no IPv6 loopback here; skipping");
        return;
    };
    let pb = SoftPort::open(SoftConfig::new(ip("::1")).with_port(0)).unwrap();
    pa.set_peer_port(pb.gid(), pb.local_addr().port());
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 1);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 1);
    b.post_recvs(0..1, SLOT);
    a.send(pb.gid(), b.qp.attr().qpn, DEFAULT_QKEY, b"six", Some(6));
    let c = b.recv(1);
    assert_eq!(c.len(), 1);
    let grh = Grh::parse(b.data(0, GRH_LEN), GrhLayout::Ipv6).unwrap();
    assert_eq!(
        grh.sgid,
        Gid::from("::1".parse::<std::net::Ipv6Addr>().unwrap())
    );
    assert_eq!(grh.ecn(), 0b10);
    assert_eq!(&b.data(0, GRH_LEN + 3)[GRH_LEN..], b"six");
}

#[test]
fn arm_reports_pending_datagrams() {
    let (pa, pb) = pair("127.83.0.1", "127.83.0.2");
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 1);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 1);
    b.post_recvs(0..1, SLOT);
    let waker = std::task::Waker::noop();
    assert!(!b.qp.arm(waker));
    a.send(pb.gid(), b.qp.attr().qpn, DEFAULT_QKEY, b"wake", None);
    let deadline = Instant::now() + Duration::from_secs(2);
    while !b.qp.arm(waker) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(b.qp.arm(waker));
    assert_eq!(b.recv(1).len(), 1);
}

/// What rxe will verify: the real IPv4 header on the wire has ID 0 and DF, and the
/// ICRC we computed matches it. Needs a raw socket (root); skipped otherwise.
#[test]
fn wire_ipv4_header_matches_icrc_assumptions() {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::io::Read;
    let Ok(mut raw) = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)) else {
        eprintln!("no raw socket (not root); skipping");
        return;
    };
    raw.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let (pa, pb) = pair("127.84.0.1", "127.84.0.2");
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 1);
    let b = Ep::new(&pb, DEFAULT_QKEY, 1);
    // DSCP EF (46) + ECT(0): the whole byte must reach the IP header.
    a.tc = 0xBA;
    a.send(
        pb.gid(),
        b.qp.attr().qpn,
        DEFAULT_QKEY,
        b"on the wire",
        Some(3),
    );
    let mut buf = [0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        assert!(
            Instant::now() < deadline,
            "packet not seen on the raw socket"
        );
        let Ok(n) = raw.read(&mut buf) else { continue };
        let p = &buf[..n];
        if n < 28 || p[12..16] != [127, 84, 0, 1] {
            continue;
        }
        let id = u16::from_be_bytes([p[4], p[5]]);
        let frag = u16::from_be_bytes([p[6], p[7]]);
        assert_eq!((id, frag), (0, 0x4000), "IPv4 ID 0 with DF expected");
        let udp = &p[20..];
        let roce = &udp[8..];
        let ctx = IcrcContext {
            ip: IpPair::V4 {
                src: Ipv4Addr::new(p[12], p[13], p[14], p[15]),
                dst: Ipv4Addr::new(p[16], p[17], p[18], p[19]),
            },
            src_port: u16::from_be_bytes([udp[0], udp[1]]),
            dst_port: u16::from_be_bytes([udp[2], udp[3]]),
        };
        let crc = codec::icrc(&ctx, id, &roce[..roce.len() - 4]);
        assert_eq!(&roce[roce.len() - 4..], &crc.to_le_bytes());
        assert_eq!(p[1], 0xBA, "TOS = the AH's traffic class");
        break;
    }
}

/// Post `sizes.len()` sends to `to` in one `post_send` (one doorbell), payload
/// `i` filled with `i + 1`, the last one signaled; wait for its completion.
fn post_chain(ep: &mut Ep, to: (Gid, u32), sizes: &[usize]) {
    let total: usize = sizes.iter().sum();
    let slots = ep.mem.region(ep.region).unwrap().len() as u32 / SLOT;
    assert!(total <= SLOT as usize * 4, "fits the sender's region tail");
    let base = (slots - 5) * SLOT;
    let ah = ep.qp.create_ah(&AhAttr::new(to.0, 0)).unwrap();
    let mut off = base as usize;
    let mut wrs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let r = ep.mem.region_mut(ep.region).unwrap();
        r.slice_mut(off, n).unwrap().fill(i as u8 + 1);
        wrs.push(SendWr {
            wr_id: i as u64,
            sge: Sge {
                region: ep.region,
                offset: off as u32,
                len: n as u32,
                lkey: ep.lkey,
            },
            ah,
            remote_qpn: to.1,
            remote_qkey: DEFAULT_QKEY,
            imm: None,
            flags: SendFlags {
                signaled: i + 1 == sizes.len(),
                inline: false,
            },
        });
        off += n;
    }
    ep.qp.post_send(&ep.mem, &wrs).unwrap();
    let mut c = [Completion::send(0); 4];
    assert_eq!(ep.qp.poll_send_cq(&mut c), 1);
    assert_eq!(c[0].status, WcStatus::Success);
    ep.qp.destroy_ah(ah).unwrap();
}

#[test]
fn one_doorbell_to_one_peer_is_one_gso_send_and_arrives_as_separate_packets() {
    let (pa, pb) = pair("127.77.0.41", "127.77.0.42");
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 16);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 16);
    b.post_recvs(0..16, SLOT);
    let to = (pb.gid(), b.qp.attr().qpn);
    // Equal segments, then a shorter last one: one GSO batch of 4. A longer one
    // after a short one cannot join it: a packet of its own.
    let sizes = [1024, 1024, 1024, 300, 2000];
    post_chain(&mut a, to, &sizes);
    let st = pa.stats();
    assert_eq!(st.tx_packets, 5, "{st:?}");
    assert_eq!(st.tx_gso_batches, 1, "{st:?}");
    let c = b.recv(5);
    assert_eq!(c.len(), 5, "every packet arrives on its own: {c:?}");
    for (i, (wc, &n)) in c.iter().zip(&sizes).enumerate() {
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.byte_len as usize, GRH_LEN + n, "packet {i}");
        assert_eq!(wc.src_qp, a.qp.attr().qpn);
        let d = b.data(i as u32, GRH_LEN + n);
        assert!(
            d[GRH_LEN..].iter().all(|&x| x == i as u8 + 1),
            "packet {i} intact and in order"
        );
    }
    assert_eq!(b.qp.drops(), Default::default());
    // Packet i of a GSO batch carries IPv4 ID i (what the kernel numbers the
    // datagrams it cuts); its ICRC covers that ID, so a receiver reading the
    // real header (kernel rxe, a NIC) verifies it directly, and this one, which
    // cannot see the IP header, finds it: the batch arrives whole (GRO), so
    // each packet's position there is its ID, checked without solving.
    let st = pb.stats();
    assert_eq!(
        (
            st.rx_bad_icrc,
            st.rx_ipv4_id_solved,
            st.rx_ipv4_id_at_position
        ),
        (0, 3, 3),
        "{st:?}"
    );
}

#[test]
fn gso_off_sends_each_packet_on_its_own() {
    let pa = SoftPort::open(
        SoftConfig {
            gso_segments: 1,
            ..SoftConfig::new(ip("127.77.0.43"))
        }
        .with_port(0),
    )
    .unwrap();
    let pb = SoftPort::open(SoftConfig::new(ip("127.77.0.44")).with_port(0)).unwrap();
    pa.set_peer_port(pb.gid(), pb.local_addr().port());
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 16);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 16);
    b.post_recvs(0..16, SLOT);
    post_chain(&mut a, (pb.gid(), b.qp.attr().qpn), &[1024, 1024, 1024]);
    let st = pa.stats();
    assert_eq!((st.tx_packets, st.tx_gso_batches), (3, 0), "{st:?}");
    assert_eq!(b.recv(3).len(), 3);
}

/// Datagrams that cannot even hold a BTH, zero-length ones included, are their
/// own drop cause (a zero-length datagram used to vanish uncounted).
#[test]
fn zero_length_and_sub_bth_datagrams_are_counted_as_runts() {
    let pb = SoftPort::open(SoftConfig::new(ip("127.92.0.2")).with_port(0)).unwrap();
    let mut b = Ep::new(&pb, DEFAULT_QKEY, 2);
    b.post_recvs(0..2, SLOT);
    let raw = UdpSocket::bind("127.92.0.1:0").unwrap();
    raw.send_to(&[], pb.local_addr()).unwrap();
    raw.send_to(&[0x64; codec::BTH_LEN - 1], pb.local_addr())
        .unwrap();
    assert_eq!(b.settle(), 0);
    let d = b.qp.drops();
    assert_eq!((d.runt, d.malformed), (2, 0), "{d:?}");
    assert_eq!(pb.stats().rx_datagrams, 2);
}

/// A receiver that does not poll while a burst arrives overflows its socket's
/// receive buffer; the kernel's drops are counted, and every packet sent is
/// either received or counted as dropped.
#[test]
fn kernel_receive_buffer_overflow_is_counted_and_reconciles() {
    const N: u32 = 600;
    let receiver = SoftConfig {
        // The kernel's minimum: a handful of datagrams.
        recv_buffer: 1,
        max_recv_wr: N,
        ..SoftConfig::new(ip("127.92.0.4")).with_port(0)
    };
    let pb = SoftPort::open(receiver).unwrap();
    // One datagram per packet: the kernel counts dropped datagrams.
    let sender = SoftConfig {
        gso_segments: 1,
        ..SoftConfig::new(ip("127.92.0.3")).with_port(0)
    };
    let pa = SoftPort::open(sender).unwrap();
    pa.set_peer_port(pb.gid(), pb.local_addr().port());
    let mut a = Ep::new(&pa, DEFAULT_QKEY, 1);
    let mut b = Ep::new(&pb, DEFAULT_QKEY, N);
    b.post_recvs(0..N, SLOT);
    let bqpn = b.qp.attr().qpn;
    for i in 0..N {
        a.send(pb.gid(), bqpn, DEFAULT_QKEY, &[i as u8; 1000], None);
    }
    let received = b.settle() as u64;
    let tx = pa.stats();
    assert_eq!(
        (tx.tx_packets, tx.tx_would_block, tx.tx_errors),
        (u64::from(N), 0, 0)
    );
    let d = b.qp.drops();
    assert!(d.kernel_rx_dropped > 0, "{d:?}");
    let counted = d.bad_pkey
        + d.bad_qkey
        + d.unknown_qpn
        + d.no_recv_posted
        + d.too_long
        + d.malformed
        + d.runt
        + d.bad_icrc
        + d.kernel_rx_dropped;
    assert_eq!(
        tx.tx_packets,
        received + counted,
        "sent = received {received} + dropped {counted}: {d:?}"
    );
    assert_eq!(pb.stats().rx_delivered, received);
}

/// Two QPs on two ports of their own, for the `check`-th conformance check
/// (addresses 127.77.0.31/32 for the first, then 127.77.0.51–56).
fn soft_qps(check: usize) -> Option<(SoftQp, SoftQp, (SoftPort, SoftPort))> {
    const ADDRS: [(&str, &str); conformance::CHECKS] = [
        ("127.77.0.31", "127.77.0.32"),
        ("127.77.0.51", "127.77.0.52"),
        ("127.77.0.53", "127.77.0.54"),
        ("127.77.0.55", "127.77.0.56"),
    ];
    let (pa, pb) = pair(ADDRS[check].0, ADDRS[check].1);
    let a = pa.create_qp(DEFAULT_QKEY).unwrap();
    let b = pb.create_qp(DEFAULT_QKEY).unwrap();
    Some((a, b, (pa, pb)))
}

conformance::suite!(soft_qps, Duration::from_millis(300));
