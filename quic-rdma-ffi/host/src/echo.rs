//! A QUIC echo server written in Rust straight on [`quic_rdma::engine`]: the
//! peer the C clients are proven against.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use quic_rdma::engine::{
    server_config, ConnHandle, Engine, EngineConfig, EngineError, Event, StreamId,
};
use quic_rdma::fabric::{UdAddr, UdQueuePair};
use sha2::{Digest, Sha256};

use crate::tls::SelfSigned;

/// What the server saw, reported when it stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EchoReport {
    /// Connections that completed the handshake.
    pub connections: u64,
    /// Bytes received (and echoed) over all streams.
    pub bytes: u64,
    /// SHA-256 of every byte received, in arrival order (for a single stream:
    /// of its content).
    pub sha256: [u8; 32],
}

/// The server, polling its engine on its own thread until [`EchoServer::stop`].
#[derive(Debug)]
pub struct EchoServer {
    addr: UdAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<EchoReport>>,
}

/// One stream being echoed.
struct Echo {
    conn: ConnHandle,
    id: StreamId,
    /// Received but not yet written back (flow control was short).
    backlog: Vec<u8>,
    /// The peer's end was read: finish ours once the backlog is out.
    fin: bool,
}

impl EchoServer {
    /// Serve on `qp` with the certificate `tls`, accepting every connection
    /// and echoing every bidirectional stream.
    pub fn spawn<Q: UdQueuePair + 'static>(qp: Q, tls: &SelfSigned) -> Result<Self, EngineError> {
        let mtu = qp.attr().active_mtu.bytes();
        let engine = Engine::new(
            qp,
            EngineConfig {
                server: Some(server_config(tls.chain(), tls.key(), mtu)?),
                routing_key: 0x5e,
                ..EngineConfig::default()
            },
        )?;
        let addr = engine.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rust-echo-server".into())
            .spawn(move || serve(engine, &flag))
            .expect("spawn the server thread");
        Ok(EchoServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> UdAddr {
        self.addr
    }

    /// Stop polling (after a short drain for closes) and report.
    pub fn stop(mut self) -> EchoReport {
        self.stop.store(true, Ordering::Release);
        let t = self.thread.take().expect("joined once");
        t.join().expect("the server thread does not panic")
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve<Q: UdQueuePair>(mut e: Engine<Q>, stop: &AtomicBool) -> EchoReport {
    let mut events = Vec::with_capacity(256);
    let mut echoes: Vec<Echo> = Vec::new();
    let mut digest = Sha256::new();
    let mut connections = 0;
    let mut bytes = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let mut drain_until: Option<Instant> = None;
    loop {
        if drain_until.is_none() && stop.load(Ordering::Acquire) {
            drain_until = Some(Instant::now() + Duration::from_millis(200));
        }
        if drain_until.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        events.clear();
        let mut progress = e.poll(Instant::now(), &mut events) > 0;
        for ev in &events {
            match *ev {
                Event::Connected { .. } => connections += 1,
                Event::StreamOpened { conn, stream } => echoes.push(Echo {
                    conn,
                    id: stream,
                    backlog: Vec::new(),
                    fin: false,
                }),
                _ => {}
            }
        }
        let mut i = 0;
        while i < echoes.len() {
            match echo(&mut e, &mut echoes[i], &mut buf, &mut digest) {
                Some(n) => {
                    bytes += n as u64;
                    progress |= n > 0;
                    i += 1;
                }
                None => {
                    echoes.swap_remove(i);
                }
            }
        }
        if progress {
            e.flush(Instant::now());
        } else {
            // Idle: let a client sharing this core run.
            std::thread::yield_now();
        }
    }
    EchoReport {
        connections,
        bytes,
        sha256: digest.finalize().into(),
    }
}

/// Move one stream along: write back what is owed, then read and echo more.
/// `Some(bytes read)`, or `None` once the stream is over (its end echoed, reset,
/// stopped, or its connection gone).
fn echo<Q: UdQueuePair>(
    e: &mut Engine<Q>,
    s: &mut Echo,
    buf: &mut [u8],
    digest: &mut Sha256,
) -> Option<usize> {
    if !s.backlog.is_empty() {
        match e.write(s.conn, s.id, &s.backlog) {
            Ok(n) => drop(s.backlog.drain(..n)),
            Err(EngineError::WouldBlock) => return Some(0),
            Err(_) => return None,
        }
        if !s.backlog.is_empty() {
            return Some(0);
        }
    }
    if s.fin {
        // All echoed: end ours too. If the connection is already gone there is
        // nobody to tell, so the result does not matter.
        let _ = e.finish(s.conn, s.id);
        return None;
    }
    let r = match e.read(s.conn, s.id, buf) {
        Ok(r) => r,
        Err(EngineError::WouldBlock) => return Some(0),
        Err(_) => return None,
    };
    let data = &buf[..r.len];
    digest.update(data);
    let written = match e.write(s.conn, s.id, data) {
        Ok(n) => n,
        Err(EngineError::WouldBlock) => 0,
        Err(_) => return None,
    };
    s.backlog.extend_from_slice(&data[written..]);
    s.fin = r.fin;
    Some(r.len)
}
