//! The engine over the `sim` fabric: the quinn adapter's pair-harness tests
//! (handshake, verified transfers with loss/duplication/reordering, migration)
//! plus the engine's own API: streams, datagrams, accept policies, close.

mod engine_common;

use std::time::Instant;

use engine_common::{moved_gid, transfer, EnginePair, MAX_ITERS};
use quic_rdma::engine::{AcceptPolicy, CloseReason, EngineError, Event, StreamId};
use quic_rdma::fabric::sim::{Faults, SimConfig};
use quic_rdma::socket::SocketConfig;
use quinn_proto::VarInt;
use sha2::{Digest, Sha256};

fn cfg(faults: Faults, seed: u64) -> SimConfig {
    SimConfig {
        faults,
        seed,
        ..SimConfig::default()
    }
}

#[test]
fn handshake_uses_the_fabric_mtu() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    assert_eq!(p.client.conn_stats(c).unwrap().path.current_mtu, 4096);
    assert_eq!(p.server.conn_stats(s).unwrap().path.current_mtu, 4096);
    assert_eq!(p.server.remote_addr(s).unwrap(), p.client.local_addr());
    assert_eq!(p.client.remote_addr(c).unwrap(), p.server.local_addr());
    assert_eq!(p.client.connection_count(), 1);
    let st = p.client.socket_stats();
    assert!(st.sent_wrs > 0 && st.recv_packets > 0);
    assert!(
        p.client.next_deadline().is_some(),
        "idle/keep-alive timers armed"
    );
}

fn big_transfer(faults: Faults, seed: u64, len: u64) {
    let mut p = EnginePair::new(cfg(faults, seed));
    let (c, s) = p.connect();
    let t = Instant::now();
    transfer(&mut p, c, s, len, seed, |_, _| {});
    let fs = p.fabric.stats();
    eprintln!(
        "{} MiB in {:?}; fabric {:?}; client {:?}",
        len >> 20,
        t.elapsed(),
        fs,
        p.client.socket_stats()
    );
    // Transmits went zero-copy from registered transmit buffers, none of
    // which quinn-proto ever had to grow.
    let ss = p.client.socket_stats();
    assert!(ss.tx_buf_sends > 0);
    assert_eq!((ss.tx_buf_reallocations, ss.tx_buf_failures), (0, 0));
    assert!(ss.tx_bufs_created <= SocketConfig::default().tx_bufs as u64);
    let cs = p.client.conn_stats(c).unwrap();
    assert_eq!(cs.path.current_mtu, 4096);
    if faults.loss > 0.0 {
        assert!(fs.lost > 0, "loss was injected");
        assert!(
            cs.path.lost_packets > 0,
            "quinn-proto saw and recovered losses"
        );
    }
    if faults.duplicate > 0.0 {
        assert!(fs.duplicated > 0 && fs.reordered > 0);
    }
}

#[test]
fn transfer_256mib_no_loss() {
    big_transfer(Faults::default(), 21, 256 << 20);
}

#[test]
fn transfer_256mib_1pct_loss_dup_reorder() {
    big_transfer(Faults::hostile(0.01), 22, 256 << 20);
}

#[test]
fn transfer_256mib_5pct_loss_dup_reorder() {
    big_transfer(Faults::hostile(0.05), 23, 256 << 20);
}

#[test]
fn client_migrates_mid_transfer() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    let old = p.client.local_addr();
    let len = 32 << 20;
    let mut moved = false;
    transfer(&mut p, c, s, len, 31, |p, sent| {
        if !moved && sent >= len / 2 {
            p.client_qp.set_gid(moved_gid());
            moved = true;
        }
    });
    assert!(moved);
    let new = p.client.local_addr();
    assert_eq!(new.gid, moved_gid());
    assert_ne!(new, old);
    // The server follows the client to its new address.
    assert_eq!(p.server.remote_addr(s).unwrap(), new);
    assert_eq!(p.client.socket_stats().gid_changes, 1);
    assert!(p.client.socket_stats().ah_rebuilt > 0 || p.client.socket_stats().ah_created > 1);
}

#[test]
fn failed_queue_pairs_recover_mid_transfer() {
    // Each side's QP enters the error state once, mid-transfer (as a HCA does
    // on a fatal error); each socket recovers it with its QPN, and QUIC
    // retransmits what the failure lost. The data still arrives intact.
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    let (cq, sq) = (p.client.local_addr(), p.server.local_addr());
    let len = 32 << 20;
    let (mut server_failed, mut client_failed) = (false, false);
    transfer(&mut p, c, s, len, 37, |p, sent| {
        if !server_failed && sent >= len / 3 {
            p.server_qp.fail();
            server_failed = true;
        }
        if !client_failed && sent >= 2 * len / 3 {
            p.client_qp.fail();
            client_failed = true;
        }
    });
    assert!(server_failed && client_failed);
    assert_eq!((p.client.local_addr(), p.server.local_addr()), (cq, sq));
    for st in [p.client.socket_stats(), p.server.socket_stats()] {
        assert_eq!(st.qp_recoveries, 1, "{st:?}");
        assert_eq!(st.qp_recovery_failures, 0, "{st:?}");
    }
}

#[test]
fn write_chunk_hands_over_a_buffer_without_copying_it() {
    // One 40 MiB buffer, more than the 16 MiB stream window: quinn-proto takes
    // it in parts, each time advancing the caller's `Bytes` past what it took.
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    let stream = p.client.open_bi(c).unwrap();
    let data = bytes::Bytes::from(
        (0..40u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect::<Vec<u8>>(),
    );
    let sent_digest: [u8; 32] = Sha256::digest(&data).into();
    let mut rest = data.clone();
    let (mut takes, mut finished) = (0, false);
    let mut server_stream = None;
    let mut got = Sha256::new();
    let (mut received, mut fin) = (0usize, false);
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..MAX_ITERS {
        if !rest.is_empty() {
            let before = rest.len();
            match p.client.write_chunk(c, stream, &mut rest) {
                Ok(n) => {
                    assert_eq!(rest.len(), before - n, "advanced past what was taken");
                    takes += 1;
                }
                Err(EngineError::WouldBlock) => {}
                Err(e) => panic!("write_chunk: {e}"),
            }
        } else if !finished {
            p.client.finish(c, stream).unwrap();
            finished = true;
        }
        p.step();
        for ev in &p.sev {
            if let Event::StreamOpened { conn, stream } = *ev {
                assert_eq!(conn, s);
                server_stream = Some(stream);
            }
        }
        if let Some(ss) = server_stream {
            loop {
                match p.server.read(s, ss, &mut buf) {
                    Ok(r) => {
                        got.update(&buf[..r.len]);
                        received += r.len;
                        if r.fin {
                            fin = true;
                            break;
                        }
                        if r.len == 0 {
                            break;
                        }
                    }
                    Err(EngineError::WouldBlock) => break,
                    Err(e) => panic!("read: {e}"),
                }
            }
        }
        if fin {
            break;
        }
    }
    assert!(fin, "transfer did not finish");
    assert!(
        takes > 1,
        "a buffer above the window is taken in parts ({takes})"
    );
    assert_eq!(received, data.len());
    let got: [u8; 32] = got.finalize().into();
    assert_eq!(
        got, sent_digest,
        "sha256 of what arrived equals what was sent"
    );
}

#[test]
fn datagrams_both_ways_and_buffer_too_small() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    let max = p.client.max_datagram_size(c).unwrap().unwrap();
    assert!(max > 3000, "datagrams use the 4096 MTU, got {max}");
    p.client.send_datagram(c, b"ping-datagram").unwrap();
    let big = vec![7u8; max + 1];
    assert!(matches!(
        p.client.send_datagram(c, &big),
        Err(EngineError::DatagramTooLarge { .. })
    ));
    let mut got = false;
    p.run_until(|p| {
        got |= p.sev.contains(&Event::Datagram { conn: s });
        got
    });
    let mut small = [0u8; 4];
    assert!(matches!(
        p.server.recv_datagram(s, &mut small),
        Err(EngineError::BufferTooSmall { needed: 13 })
    ));
    let mut buf = [0u8; 64];
    // The too-small call lost nothing.
    let n = p.server.recv_datagram(s, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"ping-datagram");
    assert!(matches!(
        p.server.recv_datagram(s, &mut buf),
        Err(EngineError::WouldBlock)
    ));
    p.server.send_datagram(s, b"pong").unwrap();
    let mut got = false;
    p.run_until(|p| {
        got |= p.cev.contains(&Event::Datagram { conn: c });
        got
    });
    let n = p.client.recv_datagram(c, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"pong");
}

/// Stream ids nobody opened are refused without a frame going out (the peer
/// would close the connection with STREAM_STATE_ERROR); a handle of one
/// engine names nothing in another; a full datagram queue says WouldBlock.
#[test]
fn unknown_ids_are_refused_and_datagrams_push_back() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    let never = |i: u64| StreamId::from(VarInt::from_u64(i).unwrap());
    for id in [4, 1, 2, 8] {
        assert!(matches!(
            p.client.write(c, never(id), b"x"),
            Err(EngineError::ClosedStream)
        ));
        assert!(matches!(
            p.client.finish(c, never(id)),
            Err(EngineError::ClosedStream)
        ));
        assert!(matches!(
            p.client.reset(c, never(id), 1),
            Err(EngineError::ClosedStream)
        ));
        assert!(matches!(
            p.client.stop(c, never(id), 1),
            Err(EngineError::ClosedStream)
        ));
    }
    assert_ne!(c.to_bits(), s.to_bits());
    assert!(matches!(
        p.server.open_bi(c),
        Err(EngineError::UnknownConnection)
    ));
    assert!(matches!(
        p.client.open_bi(s),
        Err(EngineError::UnknownConnection)
    ));
    let mut blocked = 0;
    for i in 0..5000u32 {
        match p.client.send_datagram(c, &[i as u8; 1000]) {
            Ok(()) => {}
            Err(EngineError::WouldBlock) => blocked += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        blocked > 0,
        "5 MB of datagrams without polling must push back"
    );
    let mut writable = false;
    p.run_until(|p| {
        writable |= p.cev.contains(&Event::DatagramsWritable { conn: c });
        writable
    });
    assert!(!p
        .cev
        .iter()
        .chain(&p.sev)
        .any(|e| matches!(e, Event::ConnectionLost { .. })));
}

#[test]
fn stream_reset_and_stop_are_reported() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    // Client writes then resets: the server sees a reset with the code.
    let a = p.client.open_uni(c).unwrap();
    assert_eq!(p.client.write(c, a, b"doomed").unwrap(), 6);
    p.client.flush(p.now());
    p.client.reset(c, a, 42).unwrap();
    let mut reset = None;
    p.run_until(|p| {
        for e in &p.sev {
            if let Event::StreamReset { conn, stream, code } = *e {
                assert_eq!((conn, stream), (s, a));
                reset = Some(code);
            }
        }
        reset.is_some()
    });
    assert_eq!(reset, Some(42));
    // Each side's figures say what happened; the reset ended both streams'
    // rows (one half each) and they stay readable.
    let cs = p.client.stream_stats(c, a).unwrap();
    assert_eq!(cs.bytes_written, 6);
    assert!(!cs.send_open && !cs.recv_open && !cs.finish_sent);
    let ss = p.server.stream_stats(s, a).unwrap();
    assert_eq!(ss.reset_received, Some(42));
    // Writing on a reset stream fails.
    assert!(matches!(
        p.client.write(c, a, b"x"),
        Err(EngineError::ClosedStream)
    ));
    // The server stops a client stream: the client sees Stopped and its writes fail.
    let b = p.client.open_bi(c).unwrap();
    p.client.write(c, b, b"hello").unwrap();
    let mut opened = false;
    p.run_until(|p| {
        opened |= p
            .sev
            .iter()
            .any(|e| matches!(e, Event::StreamOpened { stream, .. } if *stream == b));
        opened
    });
    p.server.stop(s, b, 7).unwrap();
    let mut stopped = None;
    p.run_until(|p| {
        for e in &p.cev {
            if let Event::StreamStopped { stream, code, .. } = *e {
                assert_eq!(stream, b);
                stopped = Some(code);
            }
        }
        stopped.is_some()
    });
    assert_eq!(stopped, Some(7));
    assert!(matches!(
        p.client.write(c, b, b"more"),
        Err(EngineError::StreamStopped(7))
    ));
    let cs = p.client.stream_stats(c, b).unwrap();
    assert_eq!((cs.bytes_written, cs.stop_received), (5, Some(7)));
    assert!(!cs.send_open && cs.recv_open, "{cs:?}");
    let ss = p.server.stream_stats(s, b).unwrap();
    assert!(ss.send_open && !ss.recv_open, "{ss:?}");
    // Reading a send-only stream of ours is a closed stream.
    let mut buf = [0u8; 8];
    assert!(matches!(
        p.client.read(c, a, &mut buf),
        Err(EngineError::ClosedStream)
    ));
    // ...and sending on the peer's unidirectional stream is refused, not a panic.
    let u = p.server.open_uni(s).unwrap();
    assert!(matches!(
        p.client.write(c, u, b"x"),
        Err(EngineError::ClosedStream)
    ));
}

#[test]
fn finished_stream_reports_finished_and_fin() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    let a = p.client.open_uni(c).unwrap();
    p.client.set_priority(c, a, 5).unwrap();
    p.client.write(c, a, b"abc").unwrap();
    p.client.finish(c, a).unwrap();
    let (mut finished, mut readable) = (false, false);
    p.run_until(|p| {
        finished |= p
            .cev
            .contains(&Event::StreamFinished { conn: c, stream: a });
        readable |= p
            .sev
            .contains(&Event::StreamReadable { conn: s, stream: a });
        finished && readable
    });
    let mut buf = [0u8; 16];
    let r = p.server.read(s, a, &mut buf).unwrap();
    assert_eq!(&buf[..r.len], b"abc");
    assert!(r.fin);
    assert!(matches!(
        p.server.read(s, a, &mut buf),
        Err(EngineError::ClosedStream)
    ));
    assert!(matches!(
        p.client.write(c, a, b"late"),
        Err(EngineError::ClosedStream)
    ));
    // The figures outlive both ends: written, finished, acknowledged; read to the end.
    let cs = p.client.stream_stats(c, a).unwrap();
    assert_eq!(cs.bytes_written, 3);
    assert!(cs.finish_sent && cs.finish_acked && !cs.send_open);
    let ss = p.server.stream_stats(s, a).unwrap();
    assert_eq!((ss.bytes_read, ss.fin_read, ss.recv_open), (3, true, false));
    // A stream nobody opened has none.
    let never = StreamId::from(VarInt::from_u32(4000));
    assert!(matches!(
        p.client.stream_stats(c, never),
        Err(EngineError::ClosedStream)
    ));
}

#[test]
fn close_reports_reason_then_frees_the_handle() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s) = p.connect();
    p.client.close(p.now(), c, 99, b"bye").unwrap();
    let mut lost = None;
    let (mut c_closed, mut s_closed) = (false, false);
    p.run_until(|p| {
        for e in &p.sev {
            if let Event::ConnectionLost { conn, reason } = *e {
                assert_eq!(conn, s);
                lost = Some(reason);
            }
        }
        c_closed |= p.cev.contains(&Event::ConnectionClosed { conn: c });
        s_closed |= p.sev.contains(&Event::ConnectionClosed { conn: s });
        if lost.is_some() && !s_closed {
            let full = p.server.close_reason(s).unwrap().unwrap().to_string();
            assert!(full.contains("bye"), "{full}");
            assert!(matches!(
                p.server.open_bi(s),
                Err(EngineError::ConnectionLost(_))
            ));
        }
        c_closed && s_closed
    });
    assert_eq!(lost, Some(CloseReason::ApplicationClosed { code: 99 }));
    // Both handles are stale now.
    assert!(matches!(
        p.client.open_bi(c),
        Err(EngineError::UnknownConnection)
    ));
    assert!(matches!(
        p.server.open_bi(s),
        Err(EngineError::UnknownConnection)
    ));
    assert_eq!(p.client.connection_count(), 0);
    assert_eq!(p.server.connection_count(), 0);
    // A new connection gets a handle the old one cannot reach.
    let (c2, _) = p.connect();
    assert_ne!(c2, c);
    assert!(matches!(
        p.client.open_bi(c),
        Err(EngineError::UnknownConnection)
    ));
    assert!(p.client.open_bi(c2).is_ok());
    assert!(matches!(
        p.client.close(p.now(), c2, 1 << 62, b""),
        Err(EngineError::InvalidArgument(_))
    ));
}

#[test]
fn manual_accept_refuse_and_retry() {
    let mut p = EnginePair::with(SimConfig::default(), AcceptPolicy::Manual);
    let server_addr = p.server.local_addr();
    // Refused: the client's connection is lost with CONNECTION_REFUSED (0x2).
    let c = p.client.connect(p.now(), server_addr, "localhost").unwrap();
    let mut lost = None;
    p.run_until(|p| {
        for e in p.sev.clone() {
            if let Event::IncomingConnection { incoming, remote } = e {
                assert_eq!(remote, p.client.local_addr());
                p.server.refuse(incoming).unwrap();
                assert!(matches!(
                    p.server.refuse(incoming),
                    Err(EngineError::UnknownIncoming)
                ));
            }
        }
        for e in &p.cev {
            if let Event::ConnectionLost { conn, reason } = *e {
                assert_eq!(conn, c);
                lost = Some(reason);
            }
        }
        lost.is_some()
    });
    assert_eq!(lost, Some(CloseReason::PeerTransportError { code: 0x2 }));
    // Retry, then accept the validated second attempt.
    let c = p.client.connect(p.now(), server_addr, "localhost").unwrap();
    let (mut retried, mut accepted, mut connected) = (false, false, false);
    p.run_until(|p| {
        for e in p.sev.clone() {
            match e {
                Event::IncomingConnection { incoming, .. } if !retried => {
                    p.server.retry(incoming).unwrap();
                    retried = true;
                }
                Event::IncomingConnection { incoming, .. } => {
                    p.server.accept(p.now(), incoming).unwrap();
                    accepted = true;
                }
                _ => {}
            }
        }
        connected |= p.cev.contains(&Event::Connected { conn: c });
        connected
    });
    assert!(retried && accepted);
}

#[test]
fn retry_policy_validates_then_connects() {
    let mut p = EnginePair::with(SimConfig::default(), AcceptPolicy::RetryThenAccept);
    let (c, s) = p.connect();
    transfer(&mut p, c, s, 1 << 20, 5, |_, _| {});
    // Exactly one connection: the retried attempt left no half-open state behind.
    assert_eq!(p.server.connection_count(), 1);
}

#[test]
fn refuse_policy_refuses() {
    let mut p = EnginePair::with(SimConfig::default(), AcceptPolicy::RefuseAll);
    let c = p
        .client
        .connect(p.now(), p.server.local_addr(), "localhost")
        .unwrap();
    let mut lost = None;
    p.run_until(|p| {
        for e in &p.cev {
            if let Event::ConnectionLost { reason, .. } = *e {
                lost = Some(reason);
            }
        }
        lost.is_some()
    });
    assert_eq!(lost, Some(CloseReason::PeerTransportError { code: 0x2 }));
    let _ = c;
}
