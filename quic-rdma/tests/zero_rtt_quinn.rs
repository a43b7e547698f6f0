//! 0-RTT through the quinn adapter (RFC 9001 §4.6): a client that resumes a
//! session sends a stream in its first flight and the server takes it, with
//! TLS configs from `quic::TlsSettings` — the same ones the engine and
//! the C API use. A server without `accept_0rtt` makes the client fall back
//! to a full handshake (no early data offered).

mod common;

use std::sync::Arc;

use common::{Certs, Pair};
use quic_rdma::fabric::sim::SimConfig;
use quic_rdma::quic::{parse_certificates, parse_private_key, TlsSettings};
use quic_rdma::quinn_adapter;
use quic_rdma::socket::SocketConfig;

fn certs(accept_0rtt: bool) -> impl FnOnce(usize) -> Certs {
    move |mtu| {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let tls = TlsSettings {
            identity: Some((
                parse_certificates(ck.cert.pem().as_bytes()).unwrap(),
                parse_private_key(ck.key_pair.serialize_pem().as_bytes()).unwrap(),
            )),
            roots: parse_certificates(ck.cert.der()).unwrap(),
            alpn: vec![b"qr-test/1".to_vec()],
            accept_0rtt,
            ..TlsSettings::default()
        };
        let transport = Arc::new(quinn_adapter::FabricConfig::new(mtu).transport_config());
        Certs {
            server: Arc::unwrap_or_clone(tls.server_config(transport.clone()).unwrap()),
            client: tls.client_config(transport).unwrap(),
        }
    }
}

/// One connection that exchanges a stream (so the session tickets arrive),
/// then closes.
async fn first_connection(p: &Pair) {
    let (c, s) = p.connect().await;
    let mut send = c.open_uni().await.unwrap();
    send.write_all(b"hello").await.unwrap();
    send.finish().unwrap();
    let mut recv = s.accept_uni().await.unwrap();
    assert_eq!(recv.read_to_end(64).await.unwrap(), b"hello");
    // The server's session ticket rides its first 1-RTT flight; the client must
    // have processed it before closing, or it has nothing to resume with. A
    // reply sent after the handshake arrives after the ticket (the sim fabric
    // delivers in order), so reading it proves the ticket is stored.
    let mut reply = s.open_uni().await.unwrap();
    reply.write_all(b"bye").await.unwrap();
    reply.finish().unwrap();
    let mut recv = c.accept_uni().await.unwrap();
    assert_eq!(recv.read_to_end(64).await.unwrap(), b"bye");
    c.close(0u32.into(), b"done");
    c.closed().await;
}

async fn resumed(accept_0rtt: bool) -> (bool, Vec<u8>) {
    let p = Pair::with_certs(
        SimConfig::default(),
        false,
        SocketConfig::default(),
        SocketConfig::default(),
        certs(accept_0rtt),
    );
    first_connection(&p).await;
    let server = p.server.clone();
    let accept = tokio::spawn(async move {
        let incoming = server.accept().await.unwrap();
        // The server side may always go 0.5-RTT; early data is read if taken.
        let (conn, _) = incoming.accept().unwrap().into_0rtt().unwrap();
        let mut recv = conn.accept_uni().await.unwrap();
        let got = recv.read_to_end(1 << 20).await.unwrap();
        (conn, got)
    });
    let connecting = p
        .client
        .connect_with(p.client_cfg.clone(), p.server_addr, "localhost")
        .unwrap();
    // The client's connection lives until the server has read (dropping the
    // last handle closes it).
    let (used_0rtt, _client) = match connecting.into_0rtt() {
        Ok((conn, accepted)) => {
            // Before any packet came back: this stream rides the first flight.
            let mut send = conn.open_uni().await.unwrap();
            send.write_all(b"early bird").await.unwrap();
            send.finish().unwrap();
            let accepted = accepted.await;
            assert!(accepted, "the server allows 0-RTT, so it must accept it");
            (accepted, conn)
        }
        Err(connecting) => {
            let conn = connecting.await.unwrap();
            let mut send = conn.open_uni().await.unwrap();
            send.write_all(b"early bird").await.unwrap();
            send.finish().unwrap();
            (false, conn)
        }
    };
    let (_conn, got) = accept.await.unwrap();
    (used_0rtt, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_connection_sends_in_its_first_flight() {
    let (used, got) = resumed(true).await;
    assert!(used, "0-RTT was not offered on resumption");
    assert_eq!(got, b"early bird");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_accept_0rtt_the_client_does_a_full_handshake() {
    let (used, got) = resumed(false).await;
    assert!(!used);
    assert_eq!(got, b"early bird");
}
