//! `qr_engine_options`: the settings beyond `qr_engine_config` that msquic
//! and quiche offer (issue 29, gap 6), in their own versioned struct that
//! `qr_engine_config.options` (v4) points to. TLS: a key-log callback and
//! server key pins, applied through `quic_rdma::quic::TlsSettings`, the one
//! TLS builder. Transport: the initial congestion window and the ACK delay
//! asked of the peer, applied to quinn-proto's `TransportConfig`.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;
use std::time::Duration;

use quic_rdma::quic::{spki_sha256, SpkiPin, TlsSettings};
use quinn_proto::AckFrequencyConfig;

use crate::error::{fail, guard, QR_EINVAL, QR_ENULL, QR_ETLS, QR_OK};
use crate::ptr::{bytes, read_versioned, Versioned};

/// A TLS key-log callback: `line` is one line of the NSS key-log format
/// (`SSLKEYLOGFILE`: `LABEL <client random, hex> <secret, hex>`), without a
/// newline, NUL-terminated, `len` bytes before the NUL; it lives only for the
/// call. Called on the thread that drives the engine (inside `qr_connect`
/// or a poll), never on another, during handshakes only.
pub type qr_keylog_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, line: *const c_char, len: usize)>;

/// Bytes of a SHA-256 pin (`qr_engine_options.pin_sha256` holds a multiple).
pub const QR_PIN_SHA256_LEN: usize = 32;
/// The most pins `qr_engine_options.pin_count` accepts.
pub const QR_PIN_MAX: usize = 64;
/// The `code` of the `QR_EVENT_CONNECTION_LOST` (reason
/// `QR_CLOSE_LOCAL_TRANSPORT`) a client reports when the server's key
/// matches no pin: QUIC's CRYPTO_ERROR for the TLS alert access_denied
/// (0x100 + 49, RFC 9001 §4.8). An untrusted chain is another alert
/// (bad_certificate 0x12a or unknown_ca 0x130).
pub const QR_CLOSE_CODE_PIN_MISMATCH: u64 = 0x131;

/// Largest `qr_engine_options.initial_cwnd` accepted (bytes): the burst a
/// new connection may send before any acknowledgement; more would overrun
/// the peer's posted receives (`recv_depth`) on a fabric that drops what
/// finds none.
pub const QR_INITIAL_CWND_MAX: u64 = 64 << 20;
/// Largest `qr_engine_options.max_ack_delay_us` accepted: quinn-proto
/// caps the delay it asks for at the larger of the path's RTT and 25 ms
/// anyway (its `AckFrequencyConfig::max_ack_delay`).
pub const QR_ACK_DELAY_MAX_US: u32 = 25_000;

/// Optional engine settings (`qr_engine_config.options`). Version 1. All
/// zero (or a NULL `options`) changes nothing. Any field out of its range
/// makes `qr_engine_new` return `QR_EINVAL` with the field and its range in
/// `qr_last_error` (never clamped); a NULL `pin_sha256` with a count is
/// `QR_ENULL`.
///
/// Not knobs, and why:
/// - Pacing: always on in quinn-proto 0.11 (its pacer spreads each
///   congestion window over the RTT), with no setting to expose.
/// - ECN: always on. The engine sends with the ECN codepoint quinn-proto
///   asks for (ECT(0)) in the GRH traffic class and hands each received
///   GRH's ECN bits to quinn-proto, which validates ECN per path (RFC 9000
///   §13.4.2) and treats CE marks as congestion (RFC 9002 §7.1). On RoCEv2
///   NICs the same CE marks also drive the NIC's own DCQCN rate control
///   (via CNPs) below QUIC. quinn-proto 0.11 does not expose whether a
///   path's ECN validation succeeded, so there is no ECN state to read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qr_engine_options {
    /// `sizeof(qr_engine_options)` as the caller knows it.
    pub struct_size: u32,
    /// Reserved: must be zero.
    pub reserved: u32,
    /// TLS key logging, client and server side: called with each secret the
    /// handshake derives (NULL: none). Whoever has these lines can decrypt
    /// the connection's traffic (e.g. in Wireshark): for debugging only.
    pub keylog: qr_keylog_fn,
    /// Passed to `keylog` as is.
    pub keylog_user: *mut c_void,
    /// Client side: `pin_count` SHA-256 digests (32 bytes each, back to back)
    /// of server SubjectPublicKeyInfos (`qr_tls_spki_sha256`). With any pin,
    /// a server is accepted only if its certificate chain verifies against
    /// `ca_der` as always and its key matches one pin; otherwise the
    /// connection fails with `QR_CLOSE_CODE_PIN_MISMATCH`. NULL with 0: no
    /// pinning. Copied by `qr_engine_new`.
    pub pin_sha256: *const u8,
    /// Number of pins at `pin_sha256` (0..=`QR_PIN_MAX`).
    pub pin_count: usize,
    /// Initial congestion window of every connection, bytes (0: the
    /// controller's default, 12000 for `QR_CC_DEFAULT`, RFC 9002 §7.2;
    /// else 2 datagrams (`2 * qr_engine_mtu`, RFC 9002's minimum
    /// window)..=`QR_INITIAL_CWND_MAX`). Applies to the `congestion`
    /// controller chosen in `qr_engine_config` (CUBIC for the default).
    pub initial_cwnd: u64,
    /// The longest a peer may wait before acknowledging, microseconds,
    /// asked of it with ACK_FREQUENCY frames (draft-ietf-quic-ack-frequency;
    /// quinn-proto peers honour it, others ignore it). 0: not asked (the
    /// peer's own max_ack_delay, 25 ms by default, RFC 9000 §18.2); else
    /// 1..=`QR_ACK_DELAY_MAX_US`. Lower means faster loss detection and
    /// window growth, at the cost of more ACK packets. This endpoint's own
    /// advertised max_ack_delay is quinn-proto's fixed 25 ms.
    pub max_ack_delay_us: u32,
    /// Reserved: must be zero.
    pub reserved2: u32,
}

// SAFETY: repr(C), first field u32 struct_size, fields valid when zeroed
// (`keylog` is an Option of a function pointer: zero is None).
unsafe impl Versioned for qr_engine_options {
    const V1_SIZE: usize = size_of::<qr_engine_options>();
}

/// The C key-log callback as rustls's `KeyLog`.
struct CKeyLog {
    cb: unsafe extern "C" fn(*mut c_void, *const c_char, usize),
    user: *mut c_void,
}

impl std::fmt::Debug for CKeyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CKeyLog")
    }
}

// SAFETY: the engine has no threads of its own: rustls calls `log` only
// inside the caller's own calls on the engine, on the caller's thread, and
// the header says so; `user` is the caller's to share as it chooses.
unsafe impl Send for CKeyLog {}
// SAFETY: as for Send: never called from two threads at once by this library.
unsafe impl Sync for CKeyLog {}

impl rustls::KeyLog for CKeyLog {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        use std::fmt::Write as _;
        let mut line = String::with_capacity(label.len() + 2 + 2 * (32 + secret.len()));
        line.push_str(label);
        for part in [client_random, secret] {
            line.push(' ');
            for b in part {
                let _ = write!(line, "{b:02x}");
            }
        }
        let len = line.len();
        // Labels and hex hold no NUL.
        let Ok(line) = CString::new(line) else { return };
        // SAFETY: the caller's callback with its own user pointer; the line is
        // NUL-terminated and lives for the call.
        unsafe { (self.cb)(self.user, line.as_ptr(), len) };
    }
}

/// The options checked and converted.
#[derive(Default)]
pub(crate) struct Options {
    key_log: Option<Arc<dyn rustls::KeyLog>>,
    pins: Vec<SpkiPin>,
    /// Initial congestion window, bytes (checked against the MTU later).
    pub(crate) initial_cwnd: Option<u64>,
    ack_delay: Option<Duration>,
}

impl qr_engine_options {
    /// Read and check the caller's options (NULL: none).
    ///
    /// # Safety
    /// `p` is NULL or a `qr_engine_options` of its `struct_size` whose
    /// `pin_sha256` holds `pin_count * 32` readable bytes.
    pub(crate) unsafe fn read(p: *const qr_engine_options) -> Result<Options, i32> {
        if p.is_null() {
            return Ok(Options::default());
        }
        // SAFETY: non-null, and the caller's contract.
        let o = unsafe { read_versioned(p, "qr_engine_options") }?;
        if o.reserved != 0 || o.reserved2 != 0 {
            return Err(fail(
                QR_EINVAL,
                "qr_engine_options.reserved and reserved2 must be zero",
            ));
        }
        if o.pin_count > QR_PIN_MAX {
            return Err(fail(
                QR_EINVAL,
                format!(
                    "pin_count {} is over QR_PIN_MAX ({QR_PIN_MAX})",
                    o.pin_count
                ),
            ));
        }
        // SAFETY: `pin_count` (bounded above) pins of 32 bytes, by contract.
        let pins = unsafe { bytes(o.pin_sha256, o.pin_count * QR_PIN_SHA256_LEN) }?;
        if o.initial_cwnd > QR_INITIAL_CWND_MAX {
            return Err(fail(
                QR_EINVAL,
                format!(
                    "initial_cwnd {} is out of range: 0 (the default) or 2 datagrams \
                     ..={QR_INITIAL_CWND_MAX}",
                    o.initial_cwnd
                ),
            ));
        }
        if o.max_ack_delay_us > QR_ACK_DELAY_MAX_US {
            return Err(fail(
                QR_EINVAL,
                format!(
                    "max_ack_delay_us {} is out of range: 0 (not asked) or 1..={QR_ACK_DELAY_MAX_US}",
                    o.max_ack_delay_us
                ),
            ));
        }
        Ok(Options {
            key_log: o.keylog.map(|cb| {
                Arc::new(CKeyLog {
                    cb,
                    user: o.keylog_user,
                }) as Arc<dyn rustls::KeyLog>
            }),
            pins: pins
                .chunks_exact(QR_PIN_SHA256_LEN)
                .map(|c| SpkiPin::try_from(c).expect("chunks of 32"))
                .collect(),
            initial_cwnd: (o.initial_cwnd != 0).then_some(o.initial_cwnd),
            ack_delay: (o.max_ack_delay_us != 0)
                .then(|| Duration::from_micros(o.max_ack_delay_us.into())),
        })
    }
}

impl Options {
    /// The TLS options into `tls`.
    pub(crate) fn apply_tls(&self, tls: &mut TlsSettings) {
        tls.key_log = self.key_log.clone();
        tls.pinned_spki_sha256 = self.pins.clone();
    }

    /// The initial window, if set, checked against `mtu` (RFC 9002 §7.2:
    /// never below the minimum window of 2 datagrams).
    pub(crate) fn initial_cwnd(&self, mtu: usize) -> Result<Option<u64>, i32> {
        match self.initial_cwnd {
            Some(w) if w < 2 * mtu as u64 => Err(fail(
                QR_EINVAL,
                format!(
                    "initial_cwnd {w} is out of range: 0 (the default) or 2 datagrams \
                     ({})..={QR_INITIAL_CWND_MAX}",
                    2 * mtu
                ),
            )),
            w => Ok(w),
        }
    }

    /// The ACK delay asked of peers, if set, into `t`.
    pub(crate) fn apply_transport(&self, t: &mut quinn_proto::TransportConfig) {
        if let Some(d) = self.ack_delay {
            let mut f = AckFrequencyConfig::default();
            f.max_ack_delay(Some(d));
            t.ack_frequency_config(Some(f));
        }
    }
}

/// The SHA-256 of the SubjectPublicKeyInfo of the DER certificate `cert`
/// (the leaf of a chain), into `out[32]`: the pin a client puts in
/// `qr_engine_options.pin_sha256` to accept only a server with this key
/// (the same value as `openssl x509 -pubkey -noout | openssl pkey -pubin
/// -outform der | sha256sum`, RFC 7469 §2.4). It stays valid when the
/// certificate is re-issued for the same key.
///
/// Returns: `QR_OK`, `QR_ENULL`, `QR_ETLS` (not a DER certificate; PEM must
/// be decoded first), `QR_EPANIC`.
///
/// # Safety
/// `cert` points to `len` readable bytes; `out` to 32 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qr_tls_spki_sha256(cert: *const u8, len: usize, out: *mut u8) -> i32 {
    guard(|| {
        if cert.is_null() || out.is_null() {
            return Err(QR_ENULL);
        }
        // SAFETY: `len` readable bytes at `cert`, by contract (non-null).
        let der = unsafe { bytes(cert, len) }?;
        let pin = spki_sha256(der)
            .ok_or_else(|| fail(QR_ETLS, "not a DER X.509 certificate (decode PEM first)"))?;
        // SAFETY: `out` holds 32 writable bytes by contract (non-null).
        unsafe { std::ptr::copy_nonoverlapping(pin.as_ptr(), out, pin.len()) };
        crate::valgrind::mark_defined(out, pin.len());
        Ok(QR_OK)
    })
}

#[cfg(test)]
mod tests {
    use quic_rdma::engine::ConnHandle;

    use super::*;
    use crate::sim_pair::SimPair;

    fn options() -> qr_engine_options {
        // SAFETY: all-zero is a valid qr_engine_options (Versioned).
        let mut o: qr_engine_options = unsafe { std::mem::zeroed() };
        o.struct_size = size_of::<qr_engine_options>() as u32;
        o
    }

    /// quinn-proto's connection statistics of the client's connection.
    fn client_stats(p: &SimPair) -> quinn_proto::ConnectionStats {
        // SAFETY: the pair's live engine, not otherwise borrowed here.
        let e = unsafe { &*p.client };
        e.engine.conn_stats(ConnHandle::from_bits(p.cconn)).unwrap()
    }

    /// A client asking for a shorter ACK delay sends ACK_FREQUENCY frames
    /// (draft-ietf-quic-ack-frequency-04 §4); without the knob it sends none.
    #[test]
    fn max_ack_delay_is_asked_of_the_peer() {
        let settle = |p: &mut SimPair| {
            for _ in 0..2000 {
                p.poll(true);
                p.poll(false);
            }
        };
        let mut plain = SimPair::connected(3);
        settle(&mut plain);
        assert_eq!(client_stats(&plain).frame_tx.ack_frequency, 0);
        let mut o = options();
        o.max_ack_delay_us = 200;
        let mut asked = SimPair::connected_with(3, &o, std::ptr::null());
        settle(&mut asked);
        assert!(client_stats(&asked).frame_tx.ack_frequency > 0);
    }

    /// The initial window is the congestion controller's: a connection
    /// starts with it (plus what the handshake's ACKs added in slow start).
    #[test]
    fn initial_cwnd_sets_the_first_window() {
        let plain = SimPair::connected(4);
        let default_cwnd = client_stats(&plain).path.cwnd;
        assert!(default_cwnd < 1 << 20, "{default_cwnd}");
        let mut o = options();
        o.initial_cwnd = 4 << 20;
        let big = SimPair::connected_with(4, &o, std::ptr::null());
        let cwnd = client_stats(&big).path.cwnd;
        assert!((4 << 20..(4 << 20) + (1 << 20)).contains(&cwnd), "{cwnd}");
    }
}
