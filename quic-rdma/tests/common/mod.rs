//! The simulated pair harness (like quinn's `Pair`): a quinn client and server
//! over the `sim` fabric, with helpers to move data and verify it end to end.
#![allow(dead_code, unreachable_pub)]

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQp, SimQpHandle, SimQpOptions};
use quic_rdma::fabric::Gid;
use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
use quic_rdma::socket::{SocketConfig, UdSocket};
use sha2::{Digest, Sha256};

pub type SimSocket = Arc<RdmaUdpSocket<SimQp>>;

/// Self-signed certificate for "localhost" and a client config trusting it.
pub struct Certs {
    pub server: quinn::ServerConfig,
    pub client: quinn::ClientConfig,
}

pub fn certs(mtu: usize) -> Certs {
    certs_with(mtu, |_| {})
}

/// Like [`certs`], with `tweak` applied to the fabric-tuned transport of both
/// sides (e.g. an explicit idle timeout a test depends on).
pub fn certs_with(mtu: usize, tweak: impl Fn(&mut quinn::TransportConfig)) -> Certs {
    let mut transport = quinn_adapter::FabricConfig::new(mtu).transport_config();
    tweak(&mut transport);
    let transport = Arc::new(transport);
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut server = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key).unwrap();
    server.transport_config(transport.clone());
    // No NEW_TOKEN frames, as `quic::TlsSettings` configures servers:
    // quinn-proto's default depends on its `bloom` feature, which a workspace
    // test build may unify in (web-transport-quinn), and the tokens' store
    // allocates on the client (engine_alloc counts that).
    let mut tokens = quinn::ValidationTokenConfig::default();
    tokens.sent(0);
    server.validation_token_config(tokens);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
    client.transport_config(transport);
    Certs { server, client }
}

pub fn gid(n: u8, ipv4: bool) -> Gid {
    if ipv4 {
        Ipv4Addr::new(10, 0, 0, n).into()
    } else {
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n)).into()
    }
}

pub fn socket_on(fabric: &SimFabric, g: Gid, cfg: SocketConfig) -> (SimSocket, SimQpHandle) {
    let qp = fabric.create_qp(g, SimQpOptions::default()).unwrap();
    let h = qp.handle();
    (
        Arc::new(RdmaUdpSocket::new(UdSocket::new(qp, cfg).unwrap())),
        h,
    )
}

pub fn endpoint<Q: quic_rdma::fabric::UdQueuePair>(
    sock: &Arc<RdmaUdpSocket<Q>>,
    server: Option<quinn::ServerConfig>,
    key: u32,
) -> quinn::Endpoint {
    quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::FabricConfig::new(sock.mtu())
            .routing_key(key)
            .endpoint_config(),
        server,
        sock.clone(),
        Arc::new(quinn::TokioRuntime),
    )
    .unwrap()
}

/// A connected quinn client and server over one `sim` fabric.
pub struct Pair {
    pub fabric: SimFabric,
    pub server: quinn::Endpoint,
    pub client: quinn::Endpoint,
    pub server_sock: SimSocket,
    pub client_sock: SimSocket,
    pub client_qp: SimQpHandle,
    pub server_qp: SimQpHandle,
    pub server_addr: SocketAddr,
    pub client_cfg: quinn::ClientConfig,
}

impl Pair {
    pub fn new(cfg: SimConfig) -> Pair {
        Self::with(cfg, false, SocketConfig::default(), SocketConfig::default())
    }

    pub fn with(
        cfg: SimConfig,
        ipv4: bool,
        client_sc: SocketConfig,
        server_sc: SocketConfig,
    ) -> Pair {
        Self::with_certs(cfg, ipv4, client_sc, server_sc, certs)
    }

    /// Like [`Pair::with`], with the certificates (and transport) from `make_certs(mtu)`.
    pub fn with_certs(
        cfg: SimConfig,
        ipv4: bool,
        client_sc: SocketConfig,
        server_sc: SocketConfig,
        make_certs: impl FnOnce(usize) -> Certs,
    ) -> Pair {
        let fabric = SimFabric::new(cfg);
        let (server_sock, server_qp) = socket_on(&fabric, gid(1, ipv4), server_sc);
        let (client_sock, client_qp) = socket_on(&fabric, gid(2, ipv4), client_sc);
        let certs = make_certs(server_sock.mtu());
        let server = endpoint(&server_sock, Some(certs.server), 0x5e);
        let client = endpoint(&client_sock, None, 0xc1);
        let server_addr = client_sock.peer_addr(server_sock.ud_addr());
        Pair {
            fabric,
            server,
            client,
            server_sock,
            client_sock,
            client_qp,
            server_qp,
            server_addr,
            client_cfg: certs.client,
        }
    }

    /// Handshake: the client's and the server's view of the new connection.
    pub async fn connect(&self) -> (quinn::Connection, quinn::Connection) {
        let connecting = self
            .client
            .connect_with(self.client_cfg.clone(), self.server_addr, "localhost")
            .unwrap();
        let server = self.server.clone();
        let accept = tokio::spawn(async move { server.accept().await.unwrap().await.unwrap() });
        let c = connecting.await.unwrap();
        let s = accept.await.unwrap();
        (c, s)
    }
}

/// Deterministic test data: chunk `i` of a stream seeded by `seed`.
pub fn fill_chunk(buf: &mut [u8], seed: u64, i: u64) {
    let mut x = seed ^ (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
    for b in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        b.copy_from_slice(&bytes[..b.len()]);
    }
}

/// `len` bytes of deterministic test data for `seed` (the chunks of [`fill_chunk`]).
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_chunk(&mut v, seed, 0);
    v
}

/// This process's resident set size, KiB (`/proc/self/status` VmRSS).
pub fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Write `len` bytes of seeded data to `send`, finish, and return their sha256.
pub async fn write_data(send: &mut quinn::SendStream, len: u64, seed: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = len;
    let mut i = 0;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill_chunk(&mut buf[..n], seed, i);
        h.update(&buf[..n]);
        send.write_all(&buf[..n]).await.unwrap();
        left -= n as u64;
        i += 1;
    }
    send.finish().unwrap();
    h.finalize().into()
}

/// Read a stream to its end: (bytes, sha256).
pub async fn read_data(recv: &mut quinn::RecvStream) -> (u64, [u8; 32]) {
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = recv.read_chunk(usize::MAX, true).await.unwrap() {
        n += chunk.bytes.len() as u64;
        h.update(&chunk.bytes);
    }
    (n, h.finalize().into())
}

/// Send `len` bytes client → server on a fresh stream; the server echoes back the
/// byte count and sha256 it computed; assert both equal what was sent.
pub async fn transfer(client: &quinn::Connection, server: &quinn::Connection, len: u64, seed: u64) {
    let srv = server.clone();
    let sink = tokio::spawn(async move {
        let (mut tx, mut rx) = srv.accept_bi().await.unwrap();
        let (n, digest) = read_data(&mut rx).await;
        tx.write_all(&n.to_be_bytes()).await.unwrap();
        tx.write_all(&digest).await.unwrap();
        tx.finish().unwrap();
        let _ = tx.stopped().await;
    });
    let (mut tx, mut rx) = client.open_bi().await.unwrap();
    let sent = write_data(&mut tx, len, seed).await;
    let reply = rx.read_to_end(40).await.unwrap();
    sink.await.unwrap();
    assert_eq!(
        u64::from_be_bytes(reply[..8].try_into().unwrap()),
        len,
        "byte count"
    );
    assert_eq!(
        &reply[8..],
        &sent[..],
        "sha256 of what arrived equals what was sent"
    );
}

/// A third party on the fabric that sends packets whose RoCE headers are wrong,
/// as a corrupted BTH/DETH would arrive: the `sim` fabric flips bytes of the
/// payload only, so header faults are forged here, each kind a known number of
/// times, and the receiver's drop counters must match exactly.
pub struct HeaderForger {
    /// Default P_Key and Q_Key.
    good: quic_rdma::fabric::sim::SimQp,
    /// A QP in another partition: its packets carry the wrong P_Key.
    foreign: quic_rdma::fabric::sim::SimQp,
    mem: quic_rdma::fabric::Memory,
    /// (region index, lkey) registered on `good` and on `foreign`.
    good_region: (u32, u32),
    foreign_region: (u32, u32),
}

/// How many packets of each header fault [`HeaderForger::inject`] sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forged {
    /// P_Key of another partition (IBA 9.6.1.1: dropped, counted as bad P_Key).
    pub bad_pkey: u64,
    /// Wrong Q_Key in the DETH (IBA 9.6.1.2: dropped, counted as bad Q_Key).
    pub bad_qkey: u64,
    /// Destination QPN no QP has (dropped by the port, counted as unknown QPN).
    pub unknown_qpn: u64,
    /// Immediate data not matching the QUIC packet's routing key (dropped by the socket).
    pub imm_mismatch: u64,
}

impl HeaderForger {
    /// A forger with its QPs on `gid`.
    pub fn new(fabric: &SimFabric, gid: Gid) -> Self {
        use quic_rdma::fabric::{Memory, Region, UdQueuePair};
        let mut good = fabric.create_qp(gid, SimQpOptions::default()).unwrap();
        let mut foreign = fabric
            .create_qp(
                gid,
                SimQpOptions {
                    pkey: 0x7F01,
                    ..SimQpOptions::default()
                },
            )
            .unwrap();
        let mut mem = Memory::new();
        let mut reg = |qp: &mut SimQp| {
            let mut r = Region::new(4096);
            qp.register(&mut r).unwrap();
            let lkey = r.lkey().unwrap();
            (mem.push(r), lkey)
        };
        let good_region = reg(&mut good);
        let foreign_region = reg(&mut foreign);
        HeaderForger {
            good,
            foreign,
            mem,
            good_region,
            foreign_region,
        }
    }

    /// Send `n` packets of each header fault to `to`, whose CIDs carry `key`.
    /// Each is a short-header-shaped QUIC packet (RFC 9000 §17.3) naming `key`.
    pub fn inject(&mut self, to: quic_rdma::fabric::UdAddr, key: u32, n: u64) -> Forged {
        let mut pkt = [0u8; 64];
        fill_chunk(&mut pkt, u64::from(key), 7);
        pkt[0] = 0x40; // short header, fixed bit set
        pkt[1] = (key >> 12) as u8;
        pkt[2] = (key >> 4) as u8;
        pkt[3] = ((key & 0xF) as u8) << 4;
        for r in [self.good_region.0, self.foreign_region.0] {
            self.mem
                .region_mut(r)
                .unwrap()
                .slice_mut(0, 64)
                .unwrap()
                .copy_from_slice(&pkt);
        }
        let mut f = Forged::default();
        for _ in 0..n {
            send(
                &mut self.foreign,
                &self.mem,
                self.foreign_region,
                to,
                to.qpn,
                to.qkey,
                key,
            );
            f.bad_pkey += 1;
            let (g, r) = (&mut self.good, self.good_region);
            send(g, &self.mem, r, to, to.qpn, to.qkey ^ 0x0101, key);
            f.bad_qkey += 1;
            send(g, &self.mem, r, to, 0xFF_FFF0, to.qkey, key);
            f.unknown_qpn += 1;
            send(g, &self.mem, r, to, to.qpn, to.qkey, key ^ 0x5);
            f.imm_mismatch += 1;
        }
        f
    }
}

/// One signaled 64-byte send from `region`; waits for (and checks) its completion.
fn send(
    qp: &mut SimQp,
    mem: &quic_rdma::fabric::Memory,
    (region, lkey): (u32, u32),
    to: quic_rdma::fabric::UdAddr,
    qpn: u32,
    qkey: u32,
    imm: u32,
) {
    use quic_rdma::fabric::{AhAttr, Completion, SendFlags, SendWr, Sge, UdQueuePair, WcStatus};
    let ah = qp.create_ah(&AhAttr::new(to.gid, imm)).unwrap();
    let wr = SendWr {
        wr_id: 1,
        sge: Sge {
            region,
            offset: 0,
            len: 64,
            lkey,
        },
        ah,
        remote_qpn: qpn,
        remote_qkey: qkey,
        imm: Some(imm),
        flags: SendFlags {
            signaled: true,
            inline: false,
        },
    };
    qp.post_send(mem, &[wr]).unwrap();
    let mut c = [Completion::send(0); 1];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while qp.poll_send_cq(&mut c) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "forged send never completed"
        );
        std::thread::yield_now();
    }
    assert_eq!(c[0].status, WcStatus::Success);
    qp.destroy_ah(ah).unwrap();
}
