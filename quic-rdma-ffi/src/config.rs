//! Versioned configuration structs and the address type.
#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use quic_rdma::engine::{AcceptPolicy, EngineConfig};
use quic_rdma::fabric::{Gid, UdAddr};
use quic_rdma::quic::config::{transport_config_with, Liveness};
use quic_rdma::quic::retry::RetryPolicy;
use quic_rdma::quic::tls::{parse_certificates, parse_private_key, TlsError, TlsSettings};
use quinn_proto::{congestion, TransportConfig, VarInt};

use crate::error::{fail, QR_EINVAL, QR_ETLS};
use crate::ptr::{bytes, text, Versioned};

/// Accept every incoming connection.
pub const QR_ACCEPT_ALL: u32 = 0;
/// Refuse every incoming connection.
pub const QR_ACCEPT_REFUSE: u32 = 1;
/// Retry (validate the address) first, then accept.
pub const QR_ACCEPT_RETRY: u32 = 2;
/// Report `QR_EVENT_INCOMING` and let the application decide.
pub const QR_ACCEPT_MANUAL: u32 = 3;

/// Answer attempts from unvalidated addresses with a Retry only while 64 or
/// more handshakes from unvalidated addresses are in flight (a spoofed flood).
pub const QR_RETRY_AUTO: u32 = 0;
/// Answer every attempt from an unvalidated address with a Retry.
pub const QR_RETRY_ALWAYS: u32 = 1;
/// Never ask for a Retry (except under `QR_ACCEPT_RETRY`).
pub const QR_RETRY_NEVER: u32 = 2;

/// A UD peer address: GID, queue pair number, Q_Key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct qr_addr {
    /// The port's GID (an IPv6 address; IPv4-mapped for RoCEv2 over IPv4).
    pub gid: [u8; 16],
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Q_Key.
    pub qkey: u32,
}

impl From<UdAddr> for qr_addr {
    fn from(a: UdAddr) -> Self {
        qr_addr {
            gid: a.gid.0,
            qpn: a.qpn,
            qkey: a.qkey,
        }
    }
}

impl From<qr_addr> for UdAddr {
    fn from(a: qr_addr) -> Self {
        UdAddr {
            gid: Gid(a.gid),
            qpn: a.qpn,
            qkey: a.qkey,
        }
    }
}

/// How to build a fabric (`qr_fabric_new`). Version 2 (version 1 ended at
/// `reorder`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qr_fabric_config {
    /// `sizeof(qr_fabric_config)` as the caller knows it.
    pub struct_size: u32,
    /// Active MTU in bytes (256, 512, 1024, 2048 or 4096); 0 means 4096.
    /// `verbs`: must be 0 (the port's active MTU applies).
    pub mtu: u32,
    /// Provider name: "sim" (in-process fabric), "soft" (RoCEv2 over UDP),
    /// "verbs" (an RDMA device through libibverbs). NULL means "sim".
    pub provider: *const c_char,
    /// Seed of the sim's fault injection.
    pub seed: u64,
    /// sim: probability a packet is lost.
    pub loss: f64,
    /// sim: probability a packet is duplicated.
    pub duplicate: f64,
    /// sim: probability a packet is reordered.
    pub reorder: f64,
    /// v2. verbs: the device name ("mlx5_0", "rxe0"); NULL: the first device.
    pub device: *const c_char,
    /// v2. verbs: the port number, 1-based (0: port 1).
    pub port: u32,
    /// Reserved: must be zero.
    pub reserved: u32,
}

// SAFETY: repr(C), first field u32 struct_size, fields valid when zeroed.
unsafe impl Versioned for qr_fabric_config {
    // Version 1 ended with `reorder`.
    const V1_SIZE: usize = std::mem::offset_of!(qr_fabric_config, device);
}

/// A timer value meaning "none": no idle timeout, or no keep-alives.
pub const QR_TIMER_OFF: u32 = u32::MAX;

/// Congestion control: the library's default (CUBIC).
pub const QR_CC_DEFAULT: u32 = 0;
/// Congestion control: NewReno (RFC 9002 §7).
pub const QR_CC_NEWRENO: u32 = 1;
/// Congestion control: CUBIC (RFC 9438).
pub const QR_CC_CUBIC: u32 = 2;
/// Congestion control: BBR (experimental in quinn-proto).
pub const QR_CC_BBR: u32 = 3;

/// How to build an engine (`qr_engine_new`). Version 2 (version 1 ended at
/// `ca_der_len`; a caller built against it passes the smaller size and gets
/// every default below).
///
/// TLS: a server sets `cert_der`/`key_der` (its certificate chain, leaf first,
/// and its private key); a client sets `ca_der` (the roots it trusts). Each
/// buffer may hold PEM (a chain: several `CERTIFICATE` blocks; a key in any
/// PEM form) or DER. Both sides may be set: with `require_client_cert` a
/// server verifies clients against `ca_der` (mutual TLS), and a client with a
/// certificate presents it when asked.
///
/// Every transport field takes 0 for the library's default (the fabric-tuned
/// values of `quic_rdma::quic::config::transport_config`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qr_engine_config {
    /// `sizeof(qr_engine_config)` as the caller knows it.
    pub struct_size: u32,
    /// One of `QR_ACCEPT_*`.
    pub accept_policy: u32,
    /// The GID of the port to open the queue pair on, as text ("fd00::1", "10.0.0.1").
    pub gid: *const c_char,
    /// The 20-bit routing key of this endpoint's connection IDs (a larger
    /// value is refused with `QR_EINVAL`, never masked).
    pub routing_key: u32,
    /// One of `QR_RETRY_*` (0, `QR_RETRY_AUTO`, is the default): when an
    /// attempt from an unvalidated address gets a Retry before the accept
    /// policy sees it (under `QR_ACCEPT_ALL` and `QR_ACCEPT_MANUAL`).
    pub retry_policy: u32,
    /// This endpoint's certificate (chain), PEM or DER (NULL: not a server,
    /// and no client certificate).
    pub cert_der: *const u8,
    /// Length of `cert_der`.
    pub cert_der_len: usize,
    /// The certificate's private key, PEM (PKCS#8, PKCS#1, SEC1) or DER.
    pub key_der: *const u8,
    /// Length of `key_der`.
    pub key_der_len: usize,
    /// Trusted root certificate(s), PEM or DER (NULL: not a client, and
    /// clients are not verified).
    pub ca_der: *const u8,
    /// Length of `ca_der`.
    pub ca_der_len: usize,
    /// v2. Server: 1 requires every client to present a certificate chaining
    /// to `ca_der` (mutual TLS); 0 asks none.
    pub require_client_cert: u32,
    /// v2. Server: 1 accepts 0-RTT early data from resuming clients. Early
    /// data can be replayed by an attacker: accept it only for requests that
    /// are safe to run twice. Clients always keep session tickets and may
    /// write before the handshake ends when resuming (`qr_conn_0rtt`;
    /// `QR_EVENT_CONNECTED`'s `code` is 1 when the server took the early data).
    pub accept_0rtt: u32,
    /// v2. ALPN protocols, comma-separated in preference order ("h3,qr/1");
    /// NULL or "" offers none. Both sides must share one when either sets it.
    pub alpn: *const c_char,
    /// v2. Idle timeout in milliseconds (0: 1500; `QR_TIMER_OFF`: none).
    pub idle_timeout_ms: u32,
    /// v2. Keep-alive interval in milliseconds (0: 300; `QR_TIMER_OFF`: none).
    /// Must be below the idle timeout.
    pub keep_alive_ms: u32,
    /// v2. Receive window per stream, bytes (0: 16 MiB).
    pub stream_window: u64,
    /// v2. Receive and send window per connection, bytes (0: 64 MiB).
    pub conn_window: u64,
    /// v2. One of `QR_CC_*`.
    pub congestion: u32,
    /// v2. Datagrams taken from the receive queue per poll (0: 256).
    pub recv_batch: u32,
    /// v2. Receives kept posted on the queue pair (0: 2048); a packet that
    /// finds none is lost, so size it to the receive window in packets.
    pub recv_depth: u32,
    /// v2. Send buffers in flight on the queue pair (0: 1024).
    pub send_slots: u32,
    /// v2. Bidirectional streams the peer may have open at once (0: 100).
    pub max_bidi_streams: u32,
    /// v2. Unidirectional streams the peer may have open at once (0: 100).
    pub max_uni_streams: u32,
}

// SAFETY: repr(C), first field u32 struct_size, fields valid when zeroed.
unsafe impl Versioned for qr_engine_config {
    // Version 1 ended with `ca_der_len`.
    const V1_SIZE: usize = std::mem::offset_of!(qr_engine_config, require_client_cert);
}

impl qr_engine_config {
    /// Check and convert (`mtu`: the queue pair's active MTU). Errors are
    /// codes, with the reason in `qr_last_error`.
    ///
    /// # Safety
    /// The string and buffer pointers are valid as the struct's docs say.
    pub(crate) unsafe fn build(&self, mtu: usize) -> Result<EngineConfig, i32> {
        // SAFETY: buffer pointers with their lengths, by contract (NULL allowed with 0).
        let (cert, key, ca) = unsafe {
            (
                bytes(self.cert_der, self.cert_der_len)?,
                bytes(self.key_der, self.key_der_len)?,
                bytes(self.ca_der, self.ca_der_len)?,
            )
        };
        let tls_err = |what: &str, e: TlsError| fail(QR_ETLS, format!("{what}: {e}"));
        let mut tls = TlsSettings {
            require_client_cert: flag(self.require_client_cert, "require_client_cert")?,
            accept_0rtt: flag(self.accept_0rtt, "accept_0rtt")?,
            alpn: if self.alpn.is_null() {
                Vec::new()
            } else {
                // SAFETY: NUL-terminated by contract.
                alpn_list(unsafe { text(self.alpn) }?)?
            },
            ..TlsSettings::default()
        };
        if !cert.is_empty() {
            let chain = parse_certificates(cert).map_err(|e| tls_err("cert_der", e))?;
            let key = parse_private_key(key).map_err(|e| tls_err("key_der", e))?;
            tls.identity = Some((chain, key));
        } else if !key.is_empty() {
            return Err(fail(QR_EINVAL, "key_der is set but cert_der is not"));
        }
        if !ca.is_empty() {
            tls.roots = parse_certificates(ca).map_err(|e| tls_err("ca_der", e))?;
        }
        let transport = self.transport(mtu)?;
        let mut engine = EngineConfig {
            accept: policy(self.accept_policy)?,
            retry: retry_policy(self.retry_policy)?,
            routing_key: self.routing_key,
            ..EngineConfig::default()
        };
        if self.recv_batch != 0 {
            engine.recv_batch = self.recv_batch as usize;
        }
        if self.recv_depth != 0 {
            engine.socket.recv_depth = self.recv_depth as usize;
        }
        if self.send_slots != 0 {
            engine.socket.send_slots = self.send_slots as usize;
        }
        if tls.identity.is_some() {
            engine.server = Some(
                tls.server_config(transport.clone())
                    .map_err(|e| tls_err("server TLS", e))?,
            );
        }
        if !tls.roots.is_empty() {
            engine.client = Some(
                tls.client_config(transport)
                    .map_err(|e| tls_err("client TLS", e))?,
            );
        }
        Ok(engine)
    }

    /// The transport settings (v2 fields; 0 keeps each default).
    fn transport(&self, mtu: usize) -> Result<Arc<TransportConfig>, i32> {
        let timer = |ms: u32, default: Duration| match ms {
            0 => Some(default),
            QR_TIMER_OFF => None,
            ms => Some(Duration::from_millis(ms.into())),
        };
        let liveness = Liveness::new(
            timer(self.keep_alive_ms, Liveness::DEFAULT_KEEP_ALIVE),
            timer(self.idle_timeout_ms, Liveness::DEFAULT_IDLE_TIMEOUT),
        )
        .map_err(|e| fail(QR_EINVAL, e))?;
        let mut t = transport_config_with(mtu, liveness);
        let varint = |v: u64, what: &str| {
            VarInt::from_u64(v).map_err(|_| fail(QR_EINVAL, format!("{what} is above 2^62")))
        };
        if self.stream_window != 0 {
            t.stream_receive_window(varint(self.stream_window, "stream_window")?);
        }
        if self.conn_window != 0 {
            t.receive_window(varint(self.conn_window, "conn_window")?)
                .send_window(self.conn_window);
        }
        if self.max_bidi_streams != 0 {
            t.max_concurrent_bidi_streams(self.max_bidi_streams.into());
        }
        if self.max_uni_streams != 0 {
            t.max_concurrent_uni_streams(self.max_uni_streams.into());
        }
        match self.congestion {
            QR_CC_DEFAULT => {}
            QR_CC_NEWRENO => {
                t.congestion_controller_factory(Arc::new(congestion::NewRenoConfig::default()));
            }
            QR_CC_CUBIC => {
                t.congestion_controller_factory(Arc::new(congestion::CubicConfig::default()));
            }
            QR_CC_BBR => {
                t.congestion_controller_factory(Arc::new(congestion::BbrConfig::default()));
            }
            other => {
                return Err(fail(
                    QR_EINVAL,
                    format!("congestion {other} is not one of QR_CC_*"),
                ))
            }
        }
        Ok(Arc::new(t))
    }
}

fn flag(v: u32, what: &str) -> Result<bool, i32> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(fail(QR_EINVAL, format!("{what} must be 0 or 1"))),
    }
}

/// "h3, qr/1" → [b"h3", b"qr/1"]: each 1..=255 bytes (RFC 7301 §3.1).
fn alpn_list(s: &str) -> Result<Vec<Vec<u8>>, i32> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            if p.len() > 255 {
                Err(fail(QR_EINVAL, "an ALPN protocol name is over 255 bytes"))
            } else {
                Ok(p.as_bytes().to_vec())
            }
        })
        .collect()
}

fn retry_policy(p: u32) -> Result<RetryPolicy, i32> {
    match p {
        QR_RETRY_AUTO => Ok(RetryPolicy::Auto),
        QR_RETRY_ALWAYS => Ok(RetryPolicy::Always),
        QR_RETRY_NEVER => Ok(RetryPolicy::Never),
        _ => Err(fail(
            QR_EINVAL,
            format!(
                "retry_policy {p} is not one of QR_RETRY_AUTO, QR_RETRY_ALWAYS, QR_RETRY_NEVER"
            ),
        )),
    }
}

fn policy(p: u32) -> Result<AcceptPolicy, i32> {
    Ok(match p {
        QR_ACCEPT_ALL => AcceptPolicy::AcceptAll,
        QR_ACCEPT_REFUSE => AcceptPolicy::RefuseAll,
        QR_ACCEPT_RETRY => AcceptPolicy::RetryThenAccept,
        QR_ACCEPT_MANUAL => AcceptPolicy::Manual,
        _ => {
            return Err(fail(
                QR_EINVAL,
                format!("accept_policy {p} is not one of QR_ACCEPT_*"),
            ))
        }
    })
}
