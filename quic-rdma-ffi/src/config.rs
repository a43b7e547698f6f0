//! Versioned configuration structs and the address type.
#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use quic_rdma::engine::{AcceptPolicy, EngineConfig};
use quic_rdma::fabric::{Gid, UdAddr};
use quic_rdma::quic::{
    parse_certificates, parse_private_key, transport_config_with, Liveness, RetryPolicy, TlsError,
    TlsSettings,
};
use quinn_proto::{congestion, TransportConfig, VarInt};

use crate::error::{fail, QR_EINVAL, QR_ETLS};
use crate::options::{qr_engine_options, Options};
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

/// Smallest `stream_window` and `conn_window` accepted (bytes; 0 is the default).
pub const QR_WINDOW_MIN: u64 = 1024;
/// Largest `stream_window` accepted (bytes): the peer may make us buffer this
/// much per stream.
pub const QR_STREAM_WINDOW_MAX: u64 = 1_073_741_824;
/// Largest `conn_window` accepted (bytes): the peer may make us buffer this
/// much per connection.
pub const QR_CONN_WINDOW_MAX: u64 = 4_294_967_296;
/// Largest `recv_batch` accepted (datagrams per poll).
pub const QR_RECV_BATCH_MAX: u32 = 4096;
/// Smallest `recv_depth` and `send_slots` accepted (0 is the default).
pub const QR_QUEUE_MIN: u32 = 64;
/// Largest `recv_depth` and `send_slots` accepted: each is a registered
/// buffer of MTU + 64 bytes (32768 at MTU 4096: 136 MB).
pub const QR_QUEUE_MAX: u32 = 32768;
/// Smallest `datagram_recv_buffer` accepted (bytes; 0 is the default): more
/// than any datagram at the largest MTU.
pub const QR_DATAGRAM_BUFFER_MIN: u64 = 16_384;
/// Largest `datagram_recv_buffer` accepted (bytes), per connection.
pub const QR_DATAGRAM_BUFFER_MAX: u64 = 268_435_456;
/// Largest `max_bidi_streams` and `max_uni_streams` accepted: quinn-proto
/// allocates the state of every stream the peer may open when a connection
/// starts.
pub const QR_STREAMS_MAX: u32 = 16384;

/// How to build an engine (`qr_engine_new`). Version 4 (version 1 ended at
/// `ca_der_len`, version 2 at `max_uni_streams`, version 3 at
/// `datagram_recv_buffer`; a caller built against an older one passes the
/// smaller size and gets every default after it).
///
/// TLS: a server sets `cert_der`/`key_der` (its certificate chain, leaf first,
/// and its private key); a client sets `ca_der` (the roots it trusts). Each
/// buffer may hold PEM (a chain: several `CERTIFICATE` blocks; a key in any
/// PEM form) or DER. Both sides may be set: with `require_client_cert` a
/// server verifies clients against `ca_der` (mutual TLS), and a client with a
/// certificate presents it when asked.
///
/// Every transport field takes 0 for the library's default (the fabric-tuned
/// values of `quic_rdma::quic::transport_config`). A value outside a
/// field's documented range is refused with `QR_EINVAL` (never clamped), and
/// `qr_last_error` names the field and its range.
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
    /// v2. Idle timeout in milliseconds (0: 1500; `QR_TIMER_OFF`: none;
    /// any other value is taken as is).
    pub idle_timeout_ms: u32,
    /// v2. Keep-alive interval in milliseconds (0: 300; `QR_TIMER_OFF`: none).
    /// Must be below the idle timeout (else `QR_EINVAL`).
    pub keep_alive_ms: u32,
    /// v2. Receive window per stream, bytes (0: 16 MiB; else
    /// `QR_WINDOW_MIN`..=`QR_STREAM_WINDOW_MAX`, 1 KiB..1 GiB).
    pub stream_window: u64,
    /// v2. Receive and send window per connection, bytes (0: 64 MiB; else
    /// `QR_WINDOW_MIN`..=`QR_CONN_WINDOW_MAX`, 1 KiB..4 GiB).
    pub conn_window: u64,
    /// v2. One of `QR_CC_*`.
    pub congestion: u32,
    /// v2. Datagrams taken from the receive queue per poll (0: 256; else
    /// 1..=`QR_RECV_BATCH_MAX`).
    pub recv_batch: u32,
    /// v2. Receives kept posted on the queue pair (0: 2048; else
    /// `QR_QUEUE_MIN`..=`QR_QUEUE_MAX`, and at most what the device allows);
    /// a packet that finds none is lost, so size it to the receive window in
    /// packets.
    pub recv_depth: u32,
    /// v2. Send buffers in flight on the queue pair (0: 1024; else
    /// `QR_QUEUE_MIN`..=`QR_QUEUE_MAX`).
    pub send_slots: u32,
    /// v2. Bidirectional streams the peer may have open at once (0: 100;
    /// else 1..=`QR_STREAMS_MAX`).
    pub max_bidi_streams: u32,
    /// v2. Unidirectional streams the peer may have open at once (0: 100;
    /// else 1..=`QR_STREAMS_MAX`).
    pub max_uni_streams: u32,
    /// v3. Bytes of received datagrams each connection holds until
    /// `qr_datagram_recv` takes them (payload plus 32 per datagram; 0: 4 MiB;
    /// else `QR_DATAGRAM_BUFFER_MIN`..=`QR_DATAGRAM_BUFFER_MAX`, 16 KiB..256
    /// MiB). When a new datagram does not fit, the oldest are dropped,
    /// counted (`qr_conn_stats.datagrams_dropped`) and reported
    /// (`QR_EVENT_DATAGRAMS_DROPPED`).
    pub datagram_recv_buffer: u64,
    /// v4. Settings beyond this struct (`qr_engine_options`: TLS key
    /// logging, server key pins); NULL: none. Read by `qr_engine_new` only.
    pub options: *const qr_engine_options,
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
        // SAFETY: NULL or a valid options struct, by contract.
        let options = unsafe { qr_engine_options::read(self.options) }?;
        options.apply_tls(&mut tls);
        if !tls.pinned_spki_sha256.is_empty() && tls.roots.is_empty() {
            return Err(fail(
                QR_EINVAL,
                "qr_engine_options.pin_sha256 needs ca_der: pins narrow the trust in \
                 ca_der, they do not replace it",
            ));
        }
        let transport = self.transport(mtu, &options)?;
        let mut engine = EngineConfig {
            accept: policy(self.accept_policy)?,
            retry: retry_policy(self.retry_policy)?,
            routing_key: self.routing_key,
            ..EngineConfig::default()
        };
        if self.recv_batch != 0 {
            engine.recv_batch = bounded(self.recv_batch, 1, QR_RECV_BATCH_MAX, "recv_batch")?;
        }
        if self.recv_depth != 0 {
            engine.socket.recv_depth =
                bounded(self.recv_depth, QR_QUEUE_MIN, QR_QUEUE_MAX, "recv_depth")?;
        }
        if self.send_slots != 0 {
            engine.socket.send_slots =
                bounded(self.send_slots, QR_QUEUE_MIN, QR_QUEUE_MAX, "send_slots")?;
        }
        if self.datagram_recv_buffer != 0 {
            engine.datagram_recv_buffer = bounded(
                self.datagram_recv_buffer,
                QR_DATAGRAM_BUFFER_MIN,
                QR_DATAGRAM_BUFFER_MAX,
                "datagram_recv_buffer",
            )?;
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

    /// The transport settings (v2 fields and the options'; 0 keeps each default).
    fn transport(&self, mtu: usize, options: &Options) -> Result<Arc<TransportConfig>, i32> {
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
        // Bounded before quinn-proto sees them: it takes any VarInt, and
        // allocates per stream the peer may open at connection start.
        if self.stream_window != 0 {
            let w = bounded(
                self.stream_window,
                QR_WINDOW_MIN,
                QR_STREAM_WINDOW_MAX,
                "stream_window",
            )?;
            t.stream_receive_window(VarInt::from_u64(w).expect("bounded below 2^62"));
        }
        if self.conn_window != 0 {
            let w = bounded(
                self.conn_window,
                QR_WINDOW_MIN,
                QR_CONN_WINDOW_MAX,
                "conn_window",
            )?;
            t.receive_window(VarInt::from_u64(w).expect("bounded below 2^62"))
                .send_window(w);
        }
        if self.max_bidi_streams != 0 {
            let n = bounded(self.max_bidi_streams, 1, QR_STREAMS_MAX, "max_bidi_streams")?;
            t.max_concurrent_bidi_streams(VarInt::from_u32(n));
        }
        if self.max_uni_streams != 0 {
            let n = bounded(self.max_uni_streams, 1, QR_STREAMS_MAX, "max_uni_streams")?;
            t.max_concurrent_uni_streams(VarInt::from_u32(n));
        }
        // The initial window is the controller's setting (RFC 9002 §7.2).
        let window = options.initial_cwnd(mtu)?;
        match (self.congestion, window) {
            (QR_CC_DEFAULT, None) => {}
            (QR_CC_NEWRENO, _) => {
                let mut c = congestion::NewRenoConfig::default();
                if let Some(w) = window {
                    c.initial_window(w);
                }
                t.congestion_controller_factory(Arc::new(c));
            }
            (QR_CC_DEFAULT | QR_CC_CUBIC, _) => {
                let mut c = congestion::CubicConfig::default();
                if let Some(w) = window {
                    c.initial_window(w);
                }
                t.congestion_controller_factory(Arc::new(c));
            }
            (QR_CC_BBR, _) => {
                let mut c = congestion::BbrConfig::default();
                if let Some(w) = window {
                    c.initial_window(w);
                }
                t.congestion_controller_factory(Arc::new(c));
            }
            (other, _) => {
                return Err(fail(
                    QR_EINVAL,
                    format!("congestion {other} is not one of QR_CC_*"),
                ))
            }
        }
        options.apply_transport(&mut t);
        Ok(Arc::new(t))
    }
}

/// `v` if it lies in `min..=max`, converted; else `QR_EINVAL` naming the
/// field and its range (an out-of-range value is refused, never clamped: a
/// huge queue used to abort the process allocating it).
fn bounded<T, U>(v: T, min: T, max: T, what: &str) -> Result<U, i32>
where
    T: PartialOrd + std::fmt::Display + Copy,
    U: TryFrom<T>,
{
    if v < min || v > max {
        return Err(fail(
            QR_EINVAL,
            format!("{what} {v} is out of range: 0 (the default) or {min}..={max}"),
        ));
    }
    U::try_from(v).map_err(|_| fail(QR_EINVAL, format!("{what} {v} does not fit")))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_refuses_outside_the_range_and_names_the_field() {
        assert_eq!(bounded::<u32, usize>(64, 64, 128, "x"), Ok(64));
        assert_eq!(bounded::<u32, usize>(128, 64, 128, "x"), Ok(128));
        assert_eq!(bounded::<u32, usize>(63, 64, 128, "x"), Err(QR_EINVAL));
        assert_eq!(
            bounded::<u32, usize>(100_000_000, QR_QUEUE_MIN, QR_QUEUE_MAX, "recv_depth"),
            Err(QR_EINVAL)
        );
        // SAFETY: qr_last_error returns a live NUL-terminated string.
        let msg = unsafe { std::ffi::CStr::from_ptr(crate::error::qr_last_error()) };
        assert_eq!(
            msg.to_str().unwrap(),
            "recv_depth 100000000 is out of range: 0 (the default) or 64..=32768"
        );
        assert_eq!(
            bounded::<u64, u64>(1 << 40, QR_WINDOW_MIN, QR_CONN_WINDOW_MAX, "conn_window"),
            Err(QR_EINVAL)
        );
    }
}
