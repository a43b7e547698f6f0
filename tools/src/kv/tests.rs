//! The channel end to end in one process, over the `sim` fabric and quinn:
//! snapshot plus log, a partial resync on the same connection, a fresh
//! snapshot when the stored one is older than the backlog, the credit window
//! holding back a replica that does not read, and a replica that fell out of
//! the backlog told to resync fully.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quic_rdma::quinn_adapter;

use super::frame::{ErrorCode, Previous};
use super::{ChannelError, Master, MasterConfig, Metrics, ReplicaConn, Session, SyncStart};
use crate::endpoint::FabricEndpoint;
use crate::provider::FabricOptions;
use crate::tls;
use quic_rdma::fabric::Provider;

/// The log byte at position `p` (any position: the test checks by formula).
fn log_byte(p: u64) -> u8 {
    (p.wrapping_mul(2_654_435_761) >> 7) as u8
}

fn log_bytes(from: u64, n: u64) -> Bytes {
    (from..from + n).map(log_byte).collect::<Vec<u8>>().into()
}

async fn read_log(s: &mut Session, from: u64, to: u64) {
    let mut at = from;
    while at < to {
        let chunk = tokio::time::timeout(Duration::from_secs(10), s.next_log())
            .await
            .expect("log stalled")
            .unwrap();
        for (i, &b) in chunk.iter().enumerate() {
            assert_eq!(b, log_byte(at + i as u64), "log byte at {}", at + i as u64);
        }
        at += chunk.len() as u64;
    }
    assert_eq!(at, to);
    assert_eq!(s.position(), to);
}

async fn read_snapshot(s: &mut Session) -> Vec<u8> {
    let mut snap = Vec::new();
    while let Some(b) = s.next_snapshot().await.unwrap() {
        snap.extend_from_slice(&b);
    }
    snap
}

#[test]
fn channel_over_sim() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server_fabric, client_fabric) = FabricEndpoint::pair(
        Provider::Sim,
        &FabricOptions {
            loss_percent: 0.0,
            seed: 12,
        },
        quinn_adapter::Liveness::quinn_adapter(),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("kv-channel-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    rt.block_on(async {
        let t = tls::configs().unwrap();
        let server = server_fabric.listen(&t.server).unwrap();
        let client = client_fabric.client().unwrap();
        let client_cfg = client_fabric.client_config(t.client);
        let server_addr = client_fabric
            .socket()
            .peer_addr(server_fabric.socket().ud_addr());

        let mut cfg = MasterConfig::new(dir.clone());
        cfg.backlog = 4 << 20;
        cfg.window = 1 << 20;
        let master = Master::new(cfg, Arc::new(Metrics::default()));
        master.reset("r1", 1000, None);
        let snapshot: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let mut w = master.begin_snapshot("r1", 1000).unwrap();
        w.write(&snapshot).unwrap();
        w.finish();
        let mut head = 1000;
        let mut append = |n: u64| {
            master.append(log_bytes(head, n));
            head += n;
            head
        };
        append(300_000);
        {
            let master = master.clone();
            let server = server.clone();
            tokio::spawn(async move {
                while let Some(inc) = server.accept().await {
                    let master = master.clone();
                    tokio::spawn(async move { master.serve(inc.await.unwrap()).await });
                }
            });
        }
        // The application's side of "fresh snapshot wanted": one at the head.
        {
            let master = master.clone();
            tokio::spawn(async move {
                loop {
                    master.snapshot_wanted().await;
                    let (replid, at) = master.position();
                    let mut w = master.begin_snapshot(&replid.unwrap(), at).unwrap();
                    w.write(b"fresh").unwrap();
                    w.finish();
                }
            });
        }
        let connect = || async {
            let conn = client
                .connect_with(client_cfg.clone(), server_addr, tls::SERVER_NAME)
                .unwrap()
                .await
                .unwrap();
            ReplicaConn::new(conn, Arc::new(Metrics::default()))
        };
        let rc = connect().await;

        // Full sync: the snapshot, then the log from its position, while more is appended.
        let mut a = rc.open_session(None).await.unwrap();
        assert_eq!(
            a.start,
            SyncStart::Full {
                replid: "r1".into(),
                position: 1000,
                previous: None,
            }
        );
        let h = append(200_000);
        assert_eq!(read_snapshot(&mut a).await, snapshot);
        read_log(&mut a, 1000, h).await;

        // Partial resync on the same connection, from a position the backlog holds.
        let mut b = rc.open_session(Some(("r1".into(), 101_000))).await.unwrap();
        assert!(matches!(
            b.start,
            SyncStart::Continue {
                position: 101_000,
                ..
            }
        ));
        assert!(b.next_snapshot().await.unwrap().is_none());
        let h = append(50_000);
        read_log(&mut b, 101_000, h).await;
        read_log(&mut a, h - 50_000, h).await;

        // Credit: a replica that does not read holds the master to one window.
        let rc2 = connect().await;
        let mut idle = rc2.open_session(Some(("r1".into(), h))).await.unwrap();
        let h2 = append(3 << 20);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let received = rc2_metrics_log_bytes(&rc2);
        assert!(
            received <= 1 << 20,
            "{received} bytes arrived past a 1 MiB window"
        );
        assert!(received > 0);
        read_log(&mut idle, h, h2).await;

        // Far behind: the backlog (4 MiB) no longer holds 1000 nor the
        // snapshot at 1000, so a fresh snapshot at the head serves it.
        let h3 = append(3 << 20);
        assert!(h3 - 1000 > 4 << 20);
        let mut c = rc.open_session(Some(("r1".into(), 1000))).await.unwrap();
        let SyncStart::Full { position, .. } = c.start.clone() else {
            panic!("{:?}", c.start);
        };
        assert!(position >= h3 - (4 << 20), "{position}");
        assert_eq!(read_snapshot(&mut c).await, b"fresh");
        read_log(&mut c, position, h3).await;
        assert!(master.metrics().sync_partial_err.load(Relaxed) >= 1);
        assert_eq!(master.metrics().sync_partial_ok.load(Relaxed), 2);
        // Session a stopped reading at h: the master sent it at most one
        // window more, and the backlog now starts 2 MiB past h, so once it
        // has drained what was sent, its session ends asking for a full resync.
        let mut at = h;
        let err = loop {
            match tokio::time::timeout(Duration::from_secs(10), a.next_log())
                .await
                .expect("no end")
            {
                Ok(chunk) => {
                    for (i, &b) in chunk.iter().enumerate() {
                        assert_eq!(b, log_byte(at + i as u64));
                    }
                    at += chunk.len() as u64;
                }
                Err(e) => break e,
            }
        };
        assert!(at <= h + (1 << 20), "{at}");
        assert!(Session::needs_full_resync(&err), "{err}");

        // PSYNC2: the history goes on under "r2" from the head (the source
        // restarted). Live sessions end with Switched; a replica holding r1
        // at or before the switch resumes under r2, told r1's end; past the
        // switch (r1's history diverged there) it needs a full sync.
        let mut live = rc.open_session(Some(("r1".into(), h3))).await.unwrap();
        master.switch_id("r2");
        let err = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = live.next_log().await {
                    break e;
                }
            }
        })
        .await
        .expect("the live session did not end");
        assert!(
            matches!(
                err,
                ChannelError::Remote {
                    code: ErrorCode::Switched,
                    ..
                }
            ),
            "{err}"
        );
        assert!(!Session::needs_full_resync(&err));
        let mut d = rc.open_session(Some(("r1".into(), h3 - 10))).await.unwrap();
        assert_eq!(
            d.start,
            SyncStart::Continue {
                replid: "r2".into(),
                position: h3 - 10,
                previous: Some(Previous {
                    replid: "r1".into(),
                    position: h3
                }),
            }
        );
        let h4 = append(1000);
        read_log(&mut d, h3 - 10, h4).await;
        let past = rc.open_session(Some(("r1".into(), h3 + 1))).await.unwrap();
        assert!(
            matches!(past.start, SyncStart::Full { .. }),
            "{:?}",
            past.start
        );
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    let _ = std::fs::remove_dir_all(&dir);
}

fn rc2_metrics_log_bytes(rc: &ReplicaConn) -> u64 {
    rc.metrics().log_bytes.load(Relaxed)
}
