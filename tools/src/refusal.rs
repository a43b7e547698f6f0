//! Why a peer closed a connection, said in words a user can act on. In TLS
//! 1.3 the client finishes its handshake before the server has checked the
//! client's certificate, so a refused certificate shows up on the client as
//! a connection closed with a TLS alert (RFC 9001 §4.8: QUIC error code
//! 0x0100 + the alert) on its first stream, not as a failed dial.

/// Why the peer closed `conn`, if it did: the TLS alert it closed with (see
/// [`tls_refusal`]), or the reason it gave with an application close (a
/// refusal such as "not granted channel ..."). Whichever call on the
/// connection fails first, the user reads the peer's words, not "connection
/// lost".
pub(crate) fn peer_refusal(conn: &quinn::Connection) -> Option<String> {
    if let Some(tls) = tls_refusal(conn) {
        return Some(tls);
    }
    match conn.close_reason()? {
        quinn::ConnectionError::ApplicationClosed(close) => Some(format!(
            "the peer closed the connection (code {}): {}",
            close.error_code,
            String::from_utf8_lossy(&close.reason)
        )),
        _ => None,
    }
}

/// The TLS alert the peer closed `conn` with, as a sentence, if it did.
pub(crate) fn tls_refusal(conn: &quinn::Connection) -> Option<String> {
    let Some(quinn::ConnectionError::ConnectionClosed(close)) = conn.close_reason() else {
        return None;
    };
    let code = u64::from(close.error_code);
    let alert = u8::try_from(code.checked_sub(0x100)?).ok()?;
    let name = rustls::AlertDescription::from(alert);
    Some(format!(
        "the peer refused our TLS handshake with alert {name:?} ({alert}): it does not accept \
         this certificate (is it signed by the CA the peer trusts, and allowed there?)"
    ))
}
