//! Attacks on `qr gateway` from the same network (issue 23, holes 1 and 3),
//! against release `qr` processes over `soft` on loopback:
//!
//! - to-fabric: 10 000 sources (a fresh UDP socket each, over 100 source
//!   IPs), four in five sending 40 bytes of junk and one in five a forged
//!   1 200-byte Initial, at about 5 000 sources/s. Junk gets no state; forged
//!   Initials churn only the small unvalidated tier; a real client that starts
//!   mid-flood completes its handshake within 1 s and transfers with sha256
//!   equal; the gateway's peak RSS stays ≤ 256 MB and its open files within
//!   the tiers' bound; everything read is forwarded or counted.
//! - to-fabric amplification: 40 sources replay real client Initials (each its
//!   own) and never answer. What comes back to each, counted on the wire
//!   (UDP payload plus Ethernet, IPv4 and UDP headers), is at most 3× what it
//!   sent (RFC 9000 §8.1), and the server did answer.
//! - to-udp: RoCEv2 packets with 3 000 rotating forged source QPNs get no UDP
//!   socket and reach nothing; 300 forged Initials from one GID get at most
//!   the per-source share of sockets; the UDP server behind answers every
//!   datagram with 4× its size, and each forged QPN gets back at most 3× what
//!   it sent, counted on the wire (RoCEv2 UDP payload plus headers).
//!
//! - to-fabric with a receive buffer made small on purpose: a burst the
//!   gateway cannot keep up with is dropped by the kernel, and
//!   `qr_gateway_udp_kernel_drops_total` says so: datagrams sent = datagrams
//!   the gateway read + kernel drops, exactly.
//!
//! Addresses 127.0.118.x, ports 19901-19919; one test at a time (they measure
//! a process and flood loopback).

mod common;
mod gateway_support;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{qr, wait_for_file, Guard, TempDir};
use gateway_support::{client_trusting, send_and_verify, udp_transport};
use quic_rdma::discovery;
use quic_rdma::fabric::soft::codec::{self, IcrcContext, IpPair, UdHeader};
use quic_rdma::fabric::DEFAULT_QKEY;
use quic_rdma::quic::{is_client_initial, key_of_datagram};
use quic_rdma_tools::prom_text;

static SERIAL: Mutex<()> = Mutex::new(());

/// Ethernet header and FCS, IPv4 and UDP: what every UDP datagram carries on
/// the wire besides its payload.
const UDP_WIRE_OVERHEAD: u64 = 18 + 20 + 8;

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 118, last)
}

/// Peak resident memory (KiB) and open files of process `pid`.
fn usage(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (hwm, fds)
}

/// The gateway's counters, settled and reconciled
/// ([`gateway_support::settled_scrape`]).
fn settled(metrics: &str) -> prom_text::Exposition {
    prom_text::parse(&gateway_support::settled_scrape(metrics)).unwrap()
}

/// `qr_gateway_<name>`.
fn g(m: &prom_text::Exposition, name: &str) -> u64 {
    m.value(&format!("qr_gateway_{name}"))
        .unwrap_or_else(|| panic!("qr_gateway_{name} missing")) as u64
}

/// A forged client Initial: a well-formed long header (v1, Initial, random
/// 8-byte CIDs) padded to 1 200 bytes, whose payload no key decrypts.
fn forged_initial(n: u64) -> Vec<u8> {
    let mut d = vec![0xC3, 0, 0, 0, 1, 8];
    d.extend_from_slice(&n.to_le_bytes());
    d.push(8);
    d.extend_from_slice(&(!n).to_le_bytes());
    d.resize(1200, 0x5A);
    d
}

/// `qr serve` for the to-fabric tests; returns it and its certificate.
fn serve(
    dir: &TempDir,
    at: Ipv4Addr,
    port: u16,
) -> (Guard, rustls::pki_types::CertificateDer<'static>) {
    let cert = dir.path("serve.der");
    let g = Guard::spawn(qr().args([
        "serve",
        "--ip",
        &at.to_string(),
        "--service-port",
        &port.to_string(),
        "--cert-out",
        cert.to_str().unwrap(),
        "--name",
        "localhost",
    ]));
    wait_for_file(&cert, Duration::from_secs(20));
    (g, std::fs::read(&cert).unwrap().into())
}

fn gateway_to_fabric(listen: &str, fabric_ip: Ipv4Addr, target: &str, metrics: &str) -> Guard {
    gateway_to_fabric_with(listen, fabric_ip, target, metrics, &[])
}

fn gateway_to_fabric_with(
    listen: &str,
    fabric_ip: Ipv4Addr,
    target: &str,
    metrics: &str,
    extra: &[&str],
) -> Guard {
    let g = Guard::spawn(
        qr().args([
            "gateway",
            "to-fabric",
            "--listen",
            listen,
            "--fabric-ip",
            &fabric_ip.to_string(),
            "--target",
            target,
            "--metrics",
            metrics,
        ])
        .args(extra),
    );
    common::http::when_up(metrics, || common::http::get_ok(metrics, "/metrics"));
    g
}

#[test]
fn to_fabric_junk_and_forged_initials_get_no_lasting_state_and_a_client_gets_in() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("gw-attack-flood");
    let (_serve, cert) = serve(&dir, ip(10), 19901);
    let listen = "127.0.118.11:19902";
    let metrics = "127.0.118.11:19903";
    let gw = gateway_to_fabric(listen, ip(11), "127.0.118.10:19901", metrics);
    let (rss_before, fds_before) = usage(gw.id());
    let gw_addr: SocketAddr = listen.parse().unwrap();

    // The flood, and a sampler of the gateway's open files while it runs.
    let done = Arc::new(AtomicBool::new(false));
    let peak_fds = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak, pid) = (done.clone(), peak_fds.clone(), gw.id());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(usage(pid).1 as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    const SOURCES: u64 = 10_000;
    let flood = std::thread::spawn(move || {
        let start = Instant::now();
        let junk = [0x40u8; 40];
        for i in 0..SOURCES {
            let s = UdpSocket::bind((ip(100 + (i % 100) as u8), 0)).unwrap();
            let d = if i % 5 == 0 {
                forged_initial(i)
            } else {
                junk.to_vec()
            };
            let _ = s.send_to(&d, gw_addr);
            // About 5 000 sources a second.
            if i % 50 == 49 {
                let due = start + Duration::from_micros(200 * (i + 1));
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
        }
        start.elapsed()
    });

    // A real client from its own address, half a second into the flood.
    std::thread::sleep(Duration::from_millis(500));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let handshake = rt.block_on(async {
        let client = quinn::Endpoint::client(SocketAddr::new(ip(12).into(), 0)).unwrap();
        let started = Instant::now();
        let conn = client
            .connect_with(client_trusting(cert, udp_transport()), gw_addr, "localhost")
            .unwrap()
            .await
            .unwrap();
        let handshake = started.elapsed();
        send_and_verify(&conn, 8 << 20).await;
        (handshake, client, conn)
    });
    let took = flood.join().unwrap();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let (handshake, client, conn) = handshake;
    // Closed (its path-MTU probes would keep the counters moving); its entry
    // stays until the idle timeout.
    conn.close(0u32.into(), b"done");
    rt.block_on(client.wait_idle());

    // Past the unvalidated expiry: only the real client is left.
    std::thread::sleep(Duration::from_millis(2600));
    let m = settled(metrics);
    let (rss_peak, fds_after) = usage(gw.id());
    let peak_fds = peak_fds.load(Ordering::Relaxed) as usize;
    eprintln!(
        "flood of {SOURCES} sources in {took:?}; real client's handshake {handshake:?}; \
         gateway peak RSS {rss_before} -> {rss_peak} KiB, open files {fds_before} -> \
         peak {peak_fds} -> {fds_after}; admitted {}, evicted {}, source limit {}, not initial {}",
        g(&m, "clients_admitted_total"),
        g(&m, "clients_evicted_total"),
        g(&m, "drop_source_limit_total"),
        g(&m, "drop_not_initial_total"),
    );
    assert!(
        handshake < Duration::from_secs(1),
        "a real client's handshake took {handshake:?} during the flood"
    );
    assert!(rss_peak <= 256 * 1024, "gateway peak RSS {rss_peak} KiB");
    // Every client holds a queue pair (and the sockets behind it); only the
    // unvalidated tier (256) and the one real client can hold any.
    let per_client_bound = fds_before + 2 * (256 + 1);
    assert!(peak_fds <= per_client_bound, "{peak_fds} open files");
    assert!(
        fds_after <= fds_before + 4,
        "{fds_before} -> {fds_after} files"
    );
    // Junk made nothing: four in five sources were junk.
    assert!(
        g(&m, "drop_not_initial_total") >= SOURCES * 4 / 5 * 9 / 10,
        "junk dropped"
    );
    assert!(g(&m, "clients_admitted_total") <= SOURCES / 5 + 1);
    assert!(g(&m, "clients_evicted_total") + g(&m, "drop_source_limit_total") > 0);
    assert_eq!(
        (g(&m, "clients_unvalidated"), g(&m, "clients_active")),
        (0, 1),
        "forged clients expired, the real one stays"
    );
    assert_eq!(g(&m, "clients_validated_total"), 1);
}

/// `n` real client Initials, each of its own connection (its own CIDs), as
/// a stock quinn client sends them.
fn real_initials(n: usize) -> Vec<Vec<u8>> {
    let sink = UdpSocket::bind((ip(41), 0)).unwrap();
    sink.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let to = sink.local_addr().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _rt = rt.enter();
    let mut out: Vec<Vec<u8>> = Vec::new();
    let (cert, _) = gateway_support::server_cert(udp_transport());
    let mut clients = Vec::new();
    let dcid = |d: &[u8]| d[6..6 + usize::from(d[5])].to_vec();
    while out.len() < n {
        let client = quinn::Endpoint::client(SocketAddr::new(ip(40).into(), 0)).unwrap();
        let connecting = client
            .connect_with(
                client_trusting(cert.clone(), udp_transport()),
                to,
                "localhost",
            )
            .unwrap();
        clients.push((client, connecting));
        // Skip retransmissions of earlier clients' Initials.
        let mut buf = [0u8; 2048];
        loop {
            let (len, _) = sink.recv_from(&mut buf).unwrap();
            let d = &buf[..len];
            assert!(is_client_initial(d));
            if out.iter().all(|o| dcid(o) != dcid(d)) {
                out.push(d.to_vec());
                break;
            }
        }
    }
    out
}

#[test]
fn to_fabric_answers_unvalidated_sources_at_most_three_times_on_the_wire() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("gw-attack-amp");
    let (_serve, _cert) = serve(&dir, ip(20), 19905);
    let listen = "127.0.118.21:19906";
    let metrics = "127.0.118.21:19907";
    let _gw = gateway_to_fabric(listen, ip(21), "127.0.118.20:19905", metrics);
    let gw_addr: SocketAddr = listen.parse().unwrap();
    let initials = real_initials(40);
    let sources: Vec<UdpSocket> = (0..initials.len())
        .map(|i| {
            let s = UdpSocket::bind((ip(50 + (i % 10) as u8), 0)).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    for (s, d) in sources.iter().zip(&initials) {
        s.send_to(d, gw_addr).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    // Collect what comes back for 4 s: past the server's retransmissions,
    // and past the unvalidated expiry.
    let mut got = vec![(0u64, 0u64); sources.len()];
    let until = Instant::now() + Duration::from_secs(4);
    let mut buf = [0u8; 65536];
    while Instant::now() < until {
        for (s, g) in sources.iter().zip(got.iter_mut()) {
            loop {
                match s.recv(&mut buf) {
                    Ok(n) => {
                        g.0 += n as u64;
                        g.1 += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("receiving the answers: {e}"),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let answered = got.iter().filter(|g| g.0 > 0).count();
    let m = settled(metrics);

    eprintln!(
        "answers to {} unvalidated sources: {got:?}; gateway held back {} datagrams",
        sources.len(),
        g(&m, "drop_amplification_total")
    );
    assert!(
        answered >= sources.len() / 2,
        "the server answered: {got:?}"
    );
    for (d, (bytes, datagrams)) in initials.iter().zip(&got) {
        let sent = d.len() as u64;
        assert!(*bytes <= 3 * sent, "{bytes} B of payload for {sent}");
        let wire = bytes + datagrams * UDP_WIRE_OVERHEAD;
        assert!(
            wire <= 3 * (sent + UDP_WIRE_OVERHEAD),
            "{wire} B on the wire for {}",
            sent + UDP_WIRE_OVERHEAD
        );
    }
    assert_eq!(g(&m, "clients_validated_total"), 0);
}

/// An attacker at `ip` forging RoCEv2 UD SENDs to one queue pair from any
/// source QPN, and counting what comes back to each.
struct Forger {
    sock: UdpSocket,
    ctx: IcrcContext,
    target: SocketAddr,
    target_qpn: u32,
    buf: Vec<u8>,
}

impl Forger {
    fn new(ip: Ipv4Addr, target: Ipv4Addr, target_qpn: u32) -> Forger {
        let sock = UdpSocket::bind((ip, 4791)).unwrap();
        sock.set_nonblocking(true).unwrap();
        Forger {
            sock,
            ctx: IcrcContext {
                ip: IpPair::V4 {
                    src: ip,
                    dst: target,
                },
                src_port: 4791,
                dst_port: 4791,
            },
            target: (target, 4791).into(),
            target_qpn,
            buf: vec![0u8; 8192],
        }
    }

    /// Send `payload` from `src_qp`; the RoCEv2 packet's length (UDP payload).
    fn send(&mut self, src_qp: u32, payload: &[u8]) -> u64 {
        let hdr = UdHeader::send(
            0xFFFF,
            self.target_qpn,
            src_qp,
            DEFAULT_QKEY,
            src_qp,
            key_of_datagram(payload),
        );
        let n = codec::encode(&hdr, payload, &self.ctx, &mut self.buf).unwrap();
        let _ = self.sock.send_to(&self.buf[..n], self.target);
        n as u64
    }

    /// Everything received so far: (RoCEv2 bytes, packets) per destination QPN.
    fn drain(&self, into: &mut HashMap<u32, (u64, u64)>) {
        let mut buf = [0u8; 8192];
        while let Ok(n) = self.sock.recv(&mut buf) {
            if let Ok(d) = codec::decode(&buf[..n]) {
                let e = into.entry(d.header.dest_qp).or_default();
                e.0 += n as u64;
                e.1 += 1;
            }
        }
    }
}

#[test]
fn to_udp_forged_qpns_get_no_sockets_and_at_most_three_times_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // An amplifying UDP "server": every datagram gets four long headers of
    // 1 200 bytes back, the first naming a fresh 8-byte CID as its own.
    let server = UdpSocket::bind((ip(30), 19910)).unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let heard = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let (heard, stop) = (heard.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let Ok((_, from)) = server.recv_from(&mut buf) else {
                    continue;
                };
                heard.fetch_add(1, Ordering::Relaxed);
                n += 1;
                let mut answer = vec![0xC3, 0, 0, 0, 1, 8];
                answer.extend_from_slice(&n.to_le_bytes());
                answer.push(8);
                answer.extend_from_slice(&(!n).to_le_bytes());
                answer.resize(1200, 0);
                for _ in 0..4 {
                    let _ = server.send_to(&answer, from);
                }
            }
        })
    };
    let metrics = "127.0.118.31:19912";
    let gw = Guard::spawn(qr().args([
        "gateway",
        "to-udp",
        "--fabric-ip",
        "127.0.118.31",
        "--service-port",
        "19911",
        "--target",
        "127.0.118.30:19910",
        "--udp-bind",
        "127.0.118.31",
        "--metrics",
        metrics,
    ]));
    common::http::when_up(metrics, || common::http::get_ok(metrics, "/metrics"));
    let info = discovery::query("127.0.118.31:19911", Duration::from_secs(5)).unwrap();
    let (_, fds_before) = usage(gw.id());
    let mut forger = Forger::new(ip(32), ip(31), info.addr.qpn);

    // 3 000 junk packets from 3 000 QPNs: nothing reaches the server.
    for qpn in 0..3_000u32 {
        forger.send(0x10_000 + qpn, &[0x40; 40]);
        if qpn % 100 == 99 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let m = settled(metrics);
    assert!(g(&m, "drop_not_initial_total") >= 2_900);
    assert_eq!(g(&m, "clients_admitted_total"), 0);
    assert_eq!(
        heard.load(Ordering::Relaxed),
        0,
        "junk reached the UDP server"
    );
    assert!(usage(gw.id()).1 <= fds_before + 2, "no socket for junk");

    // 300 forged Initials from 300 QPNs of one GID: the per-source share.
    let mut sent = HashMap::new();
    for qpn in 0..300u32 {
        let src = 0x20_000 + qpn;
        sent.insert(src, forger.send(src, &forged_initial(u64::from(qpn))));
        if qpn % 50 == 49 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let mut got = HashMap::new();
    let until = Instant::now() + Duration::from_secs(3);
    let mut peak_fds = 0;
    while Instant::now() < until {
        forger.drain(&mut got);
        peak_fds = peak_fds.max(usage(gw.id()).1);
        std::thread::sleep(Duration::from_millis(5));
    }
    let m = settled(metrics);
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    eprintln!(
        "to-udp: {} forged Initials; admitted {}, refused by the source limit {}, held back {}; \
         answers {got:?}; open files {fds_before} -> peak {peak_fds}",
        sent.len(),
        g(&m, "clients_admitted_total"),
        g(&m, "drop_source_limit_total"),
        g(&m, "drop_amplification_total"),
    );
    let share = 16;
    assert!(g(&m, "clients_admitted_total") <= share, "one GID's share");
    assert!(g(&m, "drop_source_limit_total") >= 300 - share - 10);
    assert!(
        peak_fds <= fds_before + share as usize + 2,
        "{peak_fds} files"
    );
    assert!(!got.is_empty(), "the server's answers came back");
    for (qpn, (bytes, packets)) in &got {
        let sent = sent[qpn];
        let wire = bytes + packets * UDP_WIRE_OVERHEAD;
        assert!(
            wire <= 3 * (sent + UDP_WIRE_OVERHEAD),
            "QPN {qpn:#x}: {wire} B on the wire for {}",
            sent + UDP_WIRE_OVERHEAD
        );
    }
    assert_eq!(g(&m, "clients_unvalidated"), 0, "expired");
}

#[test]
fn to_fabric_kernel_drops_are_counted_when_the_buffer_is_small() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("gw-kernel-drops");
    let (_serve, _cert) = serve(&dir, ip(40), 19912);
    let listen = "127.0.118.41:19913";
    let metrics = "127.0.118.41:19914";
    let _gw = gateway_to_fabric_with(
        listen,
        ip(41),
        "127.0.118.40:19912",
        metrics,
        &["--udp-recv-buffer", "4K"],
    );
    // Bursts of junk (each costs the gateway a parse, no state) from one
    // socket, faster than one task reads them through a 4 KiB buffer.
    let sock = UdpSocket::bind((ip(42), 0)).unwrap();
    let junk = [0x40u8; 1000];
    let sent = 50_000u64;
    for _ in 0..sent {
        sock.send_to(&junk, listen).unwrap();
    }
    let m = settled(metrics);
    let read = g(&m, "udp_rx_datagrams_total");
    let kernel = g(&m, "udp_kernel_drops_total");
    let buffer = g(&m, "udp_recv_buffer_bytes");
    eprintln!("sent {sent}, read {read}, kernel drops {kernel}, buffer {buffer} B");
    assert!(buffer < 64 << 10, "the buffer was made small: {buffer}");
    assert!(
        kernel > 0,
        "a 4 KiB buffer overflowed under {sent} datagrams"
    );
    assert_eq!(
        read + kernel,
        sent,
        "every datagram read or counted by the kernel"
    );
    assert_eq!(g(&m, "drop_not_initial_total"), read);
}
