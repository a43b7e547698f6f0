//! An independent RoCEv2 peer — not our socket, not our immediate-data
//! convention — completes a handshake and a sha256-verified transfer with
//! `qr serve` (issue 10: a plain SEND without immediate data is legal IBA and
//! must be accepted). The peer is built here from a plain UDP socket, the
//! RoCEv2 codec and a bare quinn-proto client endpoint driven by hand, like an
//! aioquic-style stack would be: every packet it sends is opcode 0x64
//! (SEND_ONLY, no ImmDt) from a QPN of its own choosing.

mod common;

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{qr, wait_for_file, Guard, TempDir};
use quic_rdma::discovery;
use quic_rdma::fabric::soft::codec::{self, IcrcContext, IpPair, UdHeader, OPCODE_UD_SEND_ONLY};
use quic_rdma::quic::{endpoint_config, transport};
use quinn_proto::{DatagramEvent, Dir, Endpoint, Event};
use serde_json::Value;
use sha2::{Digest, Sha256};

const SERVER: Ipv4Addr = Ipv4Addr::new(127, 0, 95, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 95, 2);
const SERVICE_PORT: &str = "19501";
const PEER_QPN: u32 = 0x4242;
const LEN: usize = 8 << 20;

#[test]
fn a_peer_sending_plain_sends_completes_a_transfer_with_qr_serve() {
    let dir = TempDir::new("plain-send");
    let cert = dir.path("cert.der");
    let serve = Guard::spawn(
        qr().args([
            "serve",
            "--json",
            "--once",
            "--timeout",
            "120",
            "--ip",
            "127.0.95.1",
            "--service-port",
            SERVICE_PORT,
            "--cert-out",
        ])
        .arg(&cert),
    );
    wait_for_file(&cert, Duration::from_secs(20));
    let info = discovery::query(
        format!("127.0.95.1:{SERVICE_PORT}"),
        Duration::from_secs(10),
    )
    .expect("bootstrap answer");
    let mtu = info.mtu.bytes();

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            std::fs::read(&cert).unwrap(),
        ))
        .unwrap();
    // TLS 1.3 with the ALPN `qr serve` speaks (tools/src/tls.rs).
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"qr-demo/1".to_vec()];
    let quic_tls = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut client_cfg = quinn_proto::ClientConfig::new(Arc::new(quic_tls));
    client_cfg.transport_config(transport(mtu));
    let mut ep = Endpoint::new(Arc::new(endpoint_config(mtu, 0x5eed)), None, false, None);
    // quinn-proto needs some address for the server; this peer has one server.
    let server: SocketAddr = "[::ffff:127.0.95.1]:4791".parse().unwrap();
    let start = Instant::now();
    let (_, mut conn) = ep
        .connect(start, client_cfg, server, "localhost")
        .expect("connect");

    let sock = UdpSocket::bind((PEER, 4791)).expect("bind the peer's RoCEv2 port");
    sock.set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let to: SocketAddr = (SERVER, info.udp_port).into();
    let ctx = IcrcContext {
        ip: IpPair::V4 {
            src: PEER,
            dst: SERVER,
        },
        src_port: 4791,
        dst_port: info.udp_port,
    };
    let mut psn = 0u32;
    let mut wire = vec![0u8; mtu + 64];
    let mut send_plain = |payload: &[u8]| {
        let hdr = UdHeader::send(0xFFFF, info.addr.qpn, psn, info.addr.qkey, PEER_QPN, None);
        assert_eq!(hdr.opcode(), OPCODE_UD_SEND_ONLY);
        psn = (psn + 1) & codec::MASK_24;
        let n = codec::encode(&hdr, payload, &ctx, &mut wire).unwrap();
        sock.send_to(&wire[..n], to).unwrap();
    };

    let data: Vec<u8> = (0..LEN as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9) >> 7) as u8)
        .collect();
    let sent_sha: [u8; 32] = Sha256::digest(&data).into();
    let (mut connected, mut stream, mut written, mut finished) = (false, None, 0, false);
    let mut reply = Vec::new();
    let mut rx = vec![0u8; 65536];
    let mut tx = Vec::with_capacity(mtu);
    let mut resp = Vec::new();
    while reply.len() < 40 {
        let now = Instant::now();
        assert!(now - start < Duration::from_secs(60), "no verdict in 60 s");
        // Receive whatever the server sent (it uses SEND with immediate: fine).
        while let Ok(n) = sock.recv(&mut rx) {
            let Ok(d) = codec::decode(&rx[..n]) else {
                continue;
            };
            let datagram = BytesMut::from(d.payload);
            if let Some(DatagramEvent::ConnectionEvent(_, ev)) =
                ep.handle(now, server, None, None, datagram, &mut resp)
            {
                conn.handle_event(ev);
            }
        }
        if conn.poll_timeout().is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
        }
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(back) = ep.handle_event(quinn_proto::ConnectionHandle(0), ev) {
                conn.handle_event(back);
            }
        }
        while let Some(ev) = conn.poll() {
            match ev {
                Event::Connected => connected = true,
                Event::ConnectionLost { reason } => panic!("connection lost: {reason}"),
                _ => {}
            }
        }
        if connected && stream.is_none() {
            stream = conn.streams().open(Dir::Bi);
        }
        if let Some(id) = stream {
            while written < LEN {
                match conn.send_stream(id).write(&data[written..]) {
                    Ok(n) => written += n,
                    Err(_) => break,
                }
            }
            if written == LEN && !finished {
                conn.send_stream(id).finish().unwrap();
                finished = true;
            }
            let mut rs = conn.recv_stream(id);
            let read = rs.read(true);
            if let Ok(mut chunks) = read {
                while let Ok(Some(c)) = chunks.next(usize::MAX) {
                    reply.extend_from_slice(&c.bytes);
                }
                let _ = chunks.finalize();
            }
        }
        loop {
            tx.clear();
            let Some(t) = conn.poll_transmit(now, 1, &mut tx) else {
                break;
            };
            send_plain(&tx[..t.size]);
        }
    }
    assert_eq!(
        u64::from_be_bytes(reply[..8].try_into().unwrap()),
        LEN as u64
    );
    assert_eq!(
        &reply[8..40],
        &sent_sha[..],
        "sha256 of what arrived equals what was sent"
    );
    // Close, and let the close leave.
    let now = Instant::now();
    conn.close(now, 0u32.into(), bytes::Bytes::from_static(b"done"));
    tx.clear();
    if let Some(t) = conn.poll_transmit(now, 1, &mut tx) {
        send_plain(&tx[..t.size]);
    }

    // The server's own account of the connection: from our UD address, all of
    // our bytes, the same sha256.
    let out = serve.wait(Duration::from_secs(30));
    let line = String::from_utf8_lossy(&out.stdout);
    let r: Value = line
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or_else(|| panic!("no summary from qr serve: {line}"));
    assert_eq!(r["bytes_received"], LEN as u64, "{r:#}");
    assert_eq!(r["client"]["gid"], "::ffff:127.0.95.2", "{r:#}");
    assert_eq!(r["client"]["qpn"], PEER_QPN, "{r:#}");
    let hex: String = sent_sha.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(r["sha256_received"], hex, "{r:#}");
}
